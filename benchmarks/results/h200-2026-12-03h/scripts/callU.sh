#!/usr/bin/env bash
# Call U (eighth session, issue 14): the pass's registers and bytes in flight (probs_sweep6.py: an optimistic pass,
# register caps), then providers and pass variants timed in alternation against one after another, with the SM
# clock, power and throttle reasons after every rep (interleave.py).
set -uo pipefail
R=/tmp/rU; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callU.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD/.scratch
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv,noheader > $R/gpu.txt
echo "tree $(cat .scratch/HEAD) (local HEAD; the device's git log is stale)" >> $R/gpu.txt
echo "== pass variants $(date -u +%T)"
timeout 150 python3 .scratch/probs_sweep6.py > $R/probs_sweep7.log 2>&1; tail -1 $R/probs_sweep7.log; pack
echo "== interleaved $(date -u +%T)"
timeout 330 python3 .scratch/interleave.py $R/interleave.json 20 32768/0,32768/75,4096/0,4096/75,16384/50 \
  floor,trl,chunked,chunked:r48,chunked:opt,chunked:opt_r48,chunked:b1024w2_r48,chunked:opt_b1024w2_r48 > $R/interleave.log 2>&1
grep -v "^ \|Warn\|warn" $R/interleave.log | tail -60; pack
echo "== done $(date -u +%T)"
