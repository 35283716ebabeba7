#!/usr/bin/env bash
# Call 2 (2026-12-03c): GPU tests with the hoisted decode kernel as default, then rollouts per backend at 16/128/512.
set -uo pipefail
R=/tmp/r2; rm -rf $R; mkdir -p $R
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRPO_TUI_CACHE_DIR=/tmp/grpo-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pp && ln -sfn "$PWD/kernels" /tmp/pp/grpo_kernels && ln -sfn "$PWD/presets" /tmp/pp/grpo_tui_presets
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site
pack() { tar czf $OUT/call2.tgz -C $R .; }
trap pack EXIT
echo "== gpu tests $(date -u +%T)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu > $R/gpu-tests.log 2>&1; tail -4 $R/gpu-tests.log
echo "== generation $(date -u +%T)"
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > $R/build.log 2>&1
timeout 360 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 330 \
  --backends graph,generate,graph@cudnn --batches 16,128,512 --backend-batches graph@cudnn=128 \
  --no-sampling graph@cudnn --out $R/generation > $R/gen.log 2>&1; tail -14 $R/gen.log
echo "== done $(date -u +%T)"
