#!/usr/bin/env bash
# Call N (seventh session, issue 14), tree d51dbff: why the pass is below copy bandwidth (grid order, int32
# target, Triton baselines), and the loss's chunk size at 16k/32k valid tokens (time and extra peak).
set -uo pipefail
R=/tmp/rN; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callN.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "== probs variants $(date -u +%T)"
timeout 90 python3 .scratch/probs_sweep4.py > $R/probs_sweep4.log 2>&1; tail -1 $R/probs_sweep4.log; pack
for c in 1536 1792 2048 2560; do
  echo "== chunk $c $(date -u +%T)"
  timeout 70 python3 -m grpo_kernels.bench --padding 0,75 --valid-tokens 16384,32768 --providers floor,chunked \
    --chunk-tokens $c --reps 10 --out $R/chunk-$c.json > $R/chunk-$c.log 2>&1; grep '^| loss' $R/chunk-$c.log | cut -c1-140; pack
done
echo "== done $(date -u +%T)"
