#!/usr/bin/env bash
# Call L (sixth session, issue 14), on the tree with finish_rows at 16 rows per program: the full padded bench
# (plus one case from a real run's completions/mean_length stream), the GPU kernel tests, the pass's geometry
# sweep, torch.profiler, and the bench again with the sweep's best geometry if it is not the default.
set -uo pipefail
R=/tmp/rL; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callL.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "== padded bench $(date -u +%T)"
timeout 150 python3 -m grpo_kernels.bench --padding 0,25,50,75 --valid-tokens 4096,16384,32768 --scoring \
  --lengths benchmarks/results/h200-2026-12-03f/steps-head/chunked-128.jsonl \
  --providers floor,trl,chunked,chunked-lean --reps 10 --out $R/padded.json > $R/padded.log 2>&1; grep '^| loss\|^| scoring' $R/padded.log | cut -c1-150; pack
echo "== gpu kernel tests $(date -u +%T)"
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py > $R/gpu-tests.log 2>&1; tail -1 $R/gpu-tests.log; pack
echo "== probs sweep $(date -u +%T)"
timeout 60 python3 .scratch/probs_sweep2.py > $R/probs_sweep.log 2>&1; tail -1 $R/probs_sweep.log; pack
echo "== kernel profile $(date -u +%T)"
timeout 60 python3 benchmarks/kernel_profile.py --out $R/profile > $R/profile.log 2>&1; grep -h '"mode": "loss"' $R/profile.log | cut -c1-200; pack
BEST=$(grep '^best' $R/probs_sweep.log | awk '{print $2}')
if [ -n "$BEST" ] && [ "$BEST" != "pass_b4096_w8" ]; then
  B=$(echo $BEST | sed 's/pass_b\([0-9]*\)_w\([0-9]*\)/\1/'); W=$(echo $BEST | sed 's/pass_b\([0-9]*\)_w\([0-9]*\)/\2/')
  echo "== padded bench, pass at BLOCK $B, $W warps $(date -u +%T)"
  timeout 60 python3 .scratch/bench_patched.py $B $W --padding 0 --valid-tokens 4096,32768 \
    --providers floor,chunked --reps 10 --out $R/padded-best.json > $R/padded-best.log 2>&1; grep '^| loss' $R/padded-best.log | cut -c1-150
fi
echo "== done $(date -u +%T)"
