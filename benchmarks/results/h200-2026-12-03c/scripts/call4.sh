#!/usr/bin/env bash
# Call 4 (2026-12-03c): where the head's time goes (kernel_profile) and what is live at a rollout's peak at 16 rows.
set -uo pipefail
R=/tmp/r4; rm -rf $R; mkdir -p $R
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRPO_TUI_CACHE_DIR=/tmp/grpo-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pp && ln -sfn "$PWD/kernels" /tmp/pp/grpo_kernels && ln -sfn "$PWD/presets" /tmp/pp/grpo_tui_presets
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site
pack() { tar czf $OUT/call4.tgz -C $R .; }
trap pack EXIT
echo "== kernel profile $(date -u +%T)"
timeout 110 python3 benchmarks/kernel_profile.py --out $R/kernel-profile > $R/kernel-profile.log 2>&1; tail -12 $R/kernel-profile.log
echo "== rollout peak at 16 $(date -u +%T)"
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > $R/build.log 2>&1
timeout 220 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 200 --backends graph,generate \
  --batches 16 --profile-batch 16 --no-sampling graph,generate --out $R/generation > $R/gen.log 2>&1; tail -5 $R/gen.log
for f in $R/generation/peak-*.txt; do echo "-- $f"; head -9 $f | cut -c1-200; done
echo "== done $(date -u +%T)"
