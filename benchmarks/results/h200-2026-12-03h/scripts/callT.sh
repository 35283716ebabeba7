#!/usr/bin/env bash
# Call T (eighth session, issue 14): GPU kernel tests, the pass's bytes in flight (probs_sweep6.py), where a bench
# rep's idle time sits (trace_gaps.py), the full padded bench, then the pass variants in the loss, alternated.
set -uo pipefail
R=/tmp/rT; rm -rf $R; mkdir -p $R
pack() { gzip -f $R/trace-*.json 2>/dev/null; tar czf $OUT/callT.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD/.scratch
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "tree $(cat .scratch/HEAD) (local HEAD; the device's git log is stale)" >> $R/gpu.txt
echo "== gpu kernel tests $(date -u +%T)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py > $R/gpu-tests.log 2>&1; tail -1 $R/gpu-tests.log; pack
echo "== pass variants $(date -u +%T)"
timeout 100 python3 .scratch/probs_sweep6.py > $R/probs_sweep6.log 2>&1; tail -1 $R/probs_sweep6.log; pack
echo "== trace $(date -u +%T)"
timeout 120 python3 .scratch/trace_gaps.py $R > $R/trace.log 2>&1; grep -v Warn $R/trace.log | tail -4; pack
echo "== padded bench $(date -u +%T)"
timeout 200 python3 -m grpo_kernels.bench --padding 0,25,50,75 --valid-tokens 4096,16384,32768 --scoring \
  --lengths benchmarks/results/h200-2026-12-03f/steps-head/chunked-128.jsonl \
  --providers floor,trl,chunked,chunked-lean --reps 10 --out $R/padded.json > $R/padded.log 2>&1; grep '^| loss\|^| scoring' $R/padded.log | cut -c1-150; pack
echo "== A/B $(date -u +%T)"
for i in 1 2; do for v in default rawfirst b1024w2 rawfirst_b1024w2 b1024w4; do
  timeout 60 python3 .scratch/bench_variant.py $v --padding 0,75 --valid-tokens 4096,32768 --providers floor,chunked \
    --reps 20 --no-check --out $R/ab-$v-$i.json > $R/ab-$v-$i.log 2>&1
  echo "$v $i $(grep '^| loss' $R/ab-$v-$i.log | cut -c1-110 | tr '\n' ' ')"
done; done; pack
echo "== done $(date -u +%T)"
python3 - <<'PY'
import glob, json, re
rows = {}
for p in sorted(glob.glob("/tmp/rT/ab-*.json")):
    v, i = re.match(r".*/ab-(.+)-(\d)\.json", p).groups()
    recs = json.load(open(p))["records"]
    fl = {(r["valid_tokens"], r["padding"]): r["ms"] for r in recs if r["provider"] == "floor" and r["mode"] == "loss"}
    for r in recs:
        if r["provider"] == "chunked" and r["mode"] == "loss":
            k = (r["valid_tokens"], r["padding"])
            rows.setdefault(v, []).append(f"{k[0]}/{k[1]} r{i} {r['ms']:.2f} ({r['ms'] / fl[k]:.3f}x)")
for v, xs in rows.items():
    print(v.ljust(18), " | ".join(xs))
PY
