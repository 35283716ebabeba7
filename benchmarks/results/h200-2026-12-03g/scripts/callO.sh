#!/usr/bin/env bash
# Call O (seventh session, issue 14), tree 9689a9b: the GPU kernel tests, the full padded bench (0/25/50/75% and
# a real run's lengths x 4k/16k/32k, loss and scoring, TRL, ours, lean), torch.profiler, and the pass's geometry
# and a persistent variant after the grid change.
set -uo pipefail
R=/tmp/rO; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callO.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "tree 9689a9b (local HEAD; the device's git log is stale)" >> $R/gpu.txt
echo "== gpu kernel tests $(date -u +%T)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py > $R/gpu-tests.log 2>&1; tail -1 $R/gpu-tests.log; pack
echo "== padded bench $(date -u +%T)"
timeout 200 python3 -m grpo_kernels.bench --padding 0,25,50,75 --valid-tokens 4096,16384,32768 --scoring \
  --lengths benchmarks/results/h200-2026-12-03f/steps-head/chunked-128.jsonl \
  --providers floor,trl,chunked,chunked-lean --reps 10 --out $R/padded.json > $R/padded.log 2>&1; grep '^| loss\|^| scoring' $R/padded.log | cut -c1-150; pack
echo "== kernel profile $(date -u +%T)"
timeout 80 python3 benchmarks/kernel_profile.py --out $R/profile > $R/profile.log 2>&1; grep '^| \(loss\|scoring\)' $R/profile.log | cut -c1-120; pack
echo "== probs geometry / persistent $(date -u +%T)"
timeout 90 python3 .scratch/probs_sweep5.py > $R/probs_sweep5.log 2>&1; tail -1 $R/probs_sweep5.log; pack
echo "== done $(date -u +%T)"
