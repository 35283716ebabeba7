#!/usr/bin/env bash
# Call P (seventh session, issue 14), tree 9689a9b: where a bench rep's idle time sits (trace_gaps.py).
set -uo pipefail
R=/tmp/rP; rm -rf $R; mkdir -p $R
pack() { gzip -f $R/trace-*.json 2>/dev/null; tar czf $OUT/callP.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
echo "== trace $(date -u +%T)"
timeout 150 python3 .scratch/trace_gaps.py $R > $R/trace.log 2>&1; tail -4 $R/trace.log
python3 - <<'PY'
import json
d = json.load(open("/tmp/rP/gaps.json"))
for k, reps in d.items():
    r = reps[1]
    print(k, "rep", r["rep_us"], "busy", r["busy_us"], "first_kernel", r["to_first_kernel_us"], "first_gemm", r["to_first_gemm_us"], "n_before", r["kernels_before_first_gemm"], "gaps", r["gap_total_us"], "tail", r["after_last_kernel_us"])
    for g in r["gaps_over_30us"][:6]:
        print("   ", g["us"], g["after"][:40], "->", g["before"][:40], g["cpu_ops"][:5])
PY
echo "== done $(date -u +%T)"
