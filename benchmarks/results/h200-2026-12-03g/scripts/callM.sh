#!/usr/bin/env bash
# Call M (seventh session, issue 14), tree bc4fb3f: the first chunk queued before the host sync, the row scalings
# in Triton, the first dW GEMM with beta 0. GPU kernel tests; A/B of each change (4k/32k, loss and scoring);
# torch.profiler; the pass's memory hints; the GEMMs' layouts and chunk sizes.
set -uo pipefail
R=/tmp/rM; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callM.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "tree bc4fb3f (local HEAD; the device's git log is stale)" >> $R/gpu.txt
echo "== gpu kernel tests $(date -u +%T)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py > $R/gpu-tests.log 2>&1; tail -1 $R/gpu-tests.log; pack
for m in default sync-first zero-fill torch-mul; do
  echo "== A/B $m $(date -u +%T)"
  timeout 70 python3 .scratch/bench_ab.py $m --padding 0,75 --valid-tokens 4096,32768 --scoring --providers floor,chunked \
    --reps 20 --out $R/ab-$m.json > $R/ab-$m.log 2>&1; grep '^| loss\|^| scoring' $R/ab-$m.log | cut -c1-140; pack
done
echo "== kernel profile $(date -u +%T)"
timeout 80 python3 benchmarks/kernel_profile.py --out $R/profile > $R/profile.log 2>&1; grep '^| \(loss\|scoring\)' $R/profile.log | cut -c1-120; pack
echo "== probs hints $(date -u +%T)"
timeout 60 python3 .scratch/probs_sweep3.py > $R/probs_sweep3.log 2>&1; tail -1 $R/probs_sweep3.log; pack
echo "== gemm layouts $(date -u +%T)"
timeout 60 python3 .scratch/gemm_sweep.py > $R/gemm_sweep.log 2>&1; tail -4 $R/gemm_sweep.log; pack
echo "== done $(date -u +%T)"
