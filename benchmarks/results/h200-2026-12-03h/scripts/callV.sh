#!/usr/bin/env bash
# Call V (eighth session, issue 14): the pass with two blocks per program under a 64-register cap (0.245-0.248 ms a
# 1,536-row chunk alone in call U, against 0.279), in the loss, timed in alternation with the committed pass.
set -uo pipefail
R=/tmp/rV; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callV.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD/.scratch
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv,noheader > $R/gpu.txt
echo "tree $(cat .scratch/HEAD) (local HEAD; the device's git log is stale)" >> $R/gpu.txt
echo "== interleaved $(date -u +%T)"
timeout 400 python3 .scratch/interleave.py $R/interleave.json 40 32768/0,32768/75,16384/0,4096/0 \
  floor,chunked,chunked:two_r64,chunked:two_b1024w2_r64,chunked:b1024w2_r48 > $R/interleave.log 2>&1
grep -v "^ \|Warn\|warn" $R/interleave.log | tail -40; pack
echo "== done $(date -u +%T)"
