#!/usr/bin/env bash
# Call E (fifth session, issue 13): all GPU tests on the decoder's new default (prefill held to efficient/math)
# and the once-per-call gathers; rollouts per backend at 16 / 128 / 512 in one run with the 512-sample check.
set -uo pipefail
R=/tmp/rE; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callE.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
git log -1 --format=%h > $R/commit.txt 2>/dev/null
echo "== gpu tests $(date -u +%T)"
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/gpu > $R/gpu-tests.log 2>&1; tail -2 $R/gpu-tests.log; pack
echo "== rollouts $(date -u +%T)"
timeout 350 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 300 \
  --backends graph,generate --batches 16,128,512 --out $R/generation > $R/gen.log 2>&1; tail -9 $R/gen.log
echo "== done $(date -u +%T)"
