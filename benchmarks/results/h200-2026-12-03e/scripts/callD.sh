#!/usr/bin/env bash
# Call D (fifth session): is the training rollouts' extra time cuDNN compiling prefill attention per new cache
# length, or the capture per new length? Fresh rollouts (new length each) with the default prefill attention
# vs efficient/math; then warm whole steps (one warm-up run first, mean of steps 2-3) for the step-time target.
set -uo pipefail
R=/tmp/rD; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callD.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "== fresh rollouts $(date -u +%T)"
timeout 150 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 120 \
  --backends graph,graph@triton+efficient+math --batches 128 --fresh 4 --no-sampling graph,graph@triton+efficient+math \
  --out $R/fresh > $R/fresh.log 2>&1; tail -4 $R/fresh.log
echo "== steps $(date -u +%T)"
D=$OUT; export OUT=$R
NO_PACK=1 STEP_COUNT=3 STEP_TIMEOUT=140 STEP_WARMUP="w:chunked:graph:64" \
  STEP_SPECS="generate:chunked:generate:64 graph:chunked:graph:64 generate:chunked:generate:128 graph:chunked:graph:128" \
  timeout 400 bash benchmarks/gpu_e2e.sh steps > $R/steps.log 2>&1
export OUT=$D
tail -8 $R/steps.log
echo "== done $(date -u +%T)"
