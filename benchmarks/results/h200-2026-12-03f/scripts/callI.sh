#!/usr/bin/env bash
# Call I (sixth session, issue 14): the loss's one-pass softmax (kernels/probs.py). GPU kernel tests, where a head
# call's time goes now (torch.profiler), the stage profile of one 1,536-row chunk, then the full padded bench
# (0/25/50/75% padding x 4k/16k/32k valid tokens, loss and scoring, against the floor and TRL 1.16).
set -uo pipefail
R=/tmp/rI; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callI.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
echo "== gpu kernel tests $(date -u +%T)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py > $R/gpu-tests.log 2>&1; tail -3 $R/gpu-tests.log; pack
echo "== kernel profile $(date -u +%T)"
timeout 100 python3 benchmarks/kernel_profile.py --out $R/profile > $R/profile.log 2>&1; grep -h '"mode"' $R/profile.log | cut -c1-200; pack
echo "== stage profile $(date -u +%T)"
timeout 80 python3 -m grpo_kernels.bench --batch 8,64 --providers floor,chunked --profile 1536 --reps 10 --out $R/stages.json > $R/stages.log 2>&1; tail -4 $R/stages.log | cut -c1-400; pack
echo "== padded bench $(date -u +%T)"
timeout 240 python3 -m grpo_kernels.bench --padding 0,25,50,75 --valid-tokens 4096,16384,32768 --scoring \
  --providers floor,trl,chunked,chunked-lean --reps 10 --out $R/padded.json > $R/padded.log 2>&1; tail -30 $R/padded.log | cut -c1-220
echo "== done $(date -u +%T)"
