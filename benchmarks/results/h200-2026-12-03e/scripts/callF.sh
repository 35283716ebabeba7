#!/usr/bin/env bash
# Call F (fifth session, issue 14): where a head call's time goes now (per-lane row_stats, one-pass backward
# scaling, inputs gathered and outputs scattered once per call), then the padded kernel bench, 0-75% padding.
set -uo pipefail
R=/tmp/rF; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callF.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "== kernel profile $(date -u +%T)"
timeout 120 python3 benchmarks/kernel_profile.py --out $R/profile > $R/profile.log 2>&1; tail -14 $R/profile.log; pack
echo "== padded bench $(date -u +%T)"
timeout 150 python3 -m grpo_kernels.bench --padding 0,50,75 --valid-tokens 4096,32768 --scoring \
  --providers floor,trl,chunked --reps 20 --out $R/padded.json > $R/padded.log 2>&1; tail -20 $R/padded.log
echo "== done $(date -u +%T)"
