#!/usr/bin/env bash
# Call 1 (2026-12-03c): issue 14's fused-statistics GEMM timed, issue 13's decode kernel sweep and rollout profile.
set -uo pipefail
R=/tmp/r; mkdir -p $R
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRPO_TUI_CACHE_DIR=/tmp/grpo-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pp && ln -sfn "$PWD/kernels" /tmp/pp/grpo_kernels && ln -sfn "$PWD/presets" /tmp/pp/grpo_tui_presets
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
pack() { tar czf $OUT/call1.tgz -C $R .; }
trap pack EXIT
echo "== fused tests $(date -u +%T)"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k fused_stats > $R/fused-tests.log 2>&1; tail -2 $R/fused-tests.log
echo "== fused loss bench $(date -u +%T)"
timeout 170 python3 -m grpo_kernels.bench --batch 8,32,64 --providers floor,trl,chunked,chunked-fused --out $R/fused.json > $R/fused.log 2>&1; tail -12 $R/fused.log
echo "== fused padded bench $(date -u +%T)"
timeout 130 python3 -m grpo_kernels.bench --padding 0,50,75 --valid-tokens 4096,32768 --scoring --providers floor,trl,chunked,chunked-fused --reps 10 --out $R/fused-padded.json > $R/fused-padded.log 2>&1; tail -30 $R/fused-padded.log
echo "== decode sweep $(date -u +%T)"
timeout 120 python3 benchmarks/decode_attention_bench.py --shapes 128x512x300,512x512x300 \
  --grid "block=32,64,128;stages=2,3,4;warps=4,8;target=1056,2112,4224;hoist=0,1" --out $R/decode > $R/decode.log 2>&1; cat $R/decode.log | cut -c1-400
echo "== rollout profile $(date -u +%T)"
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > $R/build.log 2>&1
timeout 150 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 110 --backends graph \
  --batches 128 --profile-batch 128 --no-sampling graph --out $R/generation > $R/gen.log 2>&1; tail -8 $R/gen.log
echo "== done $(date -u +%T)"
