#!/usr/bin/env bash
# Call K (sixth session, issue 14): the probs pass with a vectorised store (call I's masked store ran 0.9 ms per
# chunk), its warps, then the stage profile, torch.profiler and the padded bench again, GPU kernel tests last.
set -uo pipefail
R=/tmp/rK; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callK.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "== probs sweep $(date -u +%T)"
timeout 90 python3 .scratch/probs_sweep.py > $R/probs_sweep.log 2>&1; tail -9 $R/probs_sweep.log; pack
echo "== stage profile $(date -u +%T)"
timeout 80 python3 -m grpo_kernels.bench --batch 8,64 --providers floor,trl,chunked --profile 1536 --reps 10 --out $R/stages.json > $R/stages.log 2>&1; tail -4 $R/stages.log | cut -c1-300; grep '"rows"' $R/stages.log | cut -c1-400; pack
echo "== kernel profile $(date -u +%T)"
timeout 100 python3 benchmarks/kernel_profile.py --out $R/profile > $R/profile.log 2>&1; grep -h '"mode"' $R/profile.log | cut -c1-250; pack
echo "== padded bench $(date -u +%T)"
timeout 240 python3 -m grpo_kernels.bench --padding 0,25,50,75 --valid-tokens 4096,16384,32768 --scoring \
  --providers floor,trl,chunked,chunked-lean --reps 10 --out $R/padded.json > $R/padded.log 2>&1; grep '^| loss\|^| scoring' $R/padded.log | cut -c1-200; pack
echo "== gpu kernel tests $(date -u +%T)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py > $R/gpu-tests.log 2>&1; tail -2 $R/gpu-tests.log
echo "== done $(date -u +%T)"
