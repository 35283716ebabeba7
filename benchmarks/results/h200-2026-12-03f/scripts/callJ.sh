#!/usr/bin/env bash
# Call J (sixth session, issue 14 item 5): warm whole steps after the one-pass softmax, chunked vs trl on graph
# rollouts at 64 and 128 (a warm-up run at each batch size first, so that neither head pays the first run's
# one-time costs at a size), and the chunked head at 128 with model.sdpa_kernels = ["efficient"].
set -uo pipefail
R=/tmp/rJ; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callJ.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
D=$OUT; export OUT=$R
NO_PACK=1 STEP_COUNT=3 STEP_TIMEOUT=100 STEP_WARMUP="w:chunked:graph:64 w2:trl:graph:128" \
  STEP_SPECS='trl:trl:graph:64 chunked:chunked:graph:64 chunked:chunked:graph:128 trl:trl:graph:128 eff:chunked:graph:128:model.sdpa_kernels=["efficient"]' \
  timeout 540 bash benchmarks/gpu_e2e.sh steps > $R/steps.log 2>&1
export OUT=$D
tail -9 $R/steps.log
