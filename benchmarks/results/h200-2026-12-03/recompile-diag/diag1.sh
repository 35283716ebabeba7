#!/usr/bin/env bash
# Diagnose: chunked's scoring/loss slowdown after graph rollouts (batch 64, 3 steps, step 3 profiled).
set -u
mkdir -p /tmp/g1
for cfg in "chunked graph" "trl graph" "chunked generate"; do
  set -- $cfg
  TRITON_CACHE_DIR=/tmp/tc-$1-$2 EXTRA_SETS=grpo.generation_backend=$2 PROFILE_IMPLS=$1 PROFILE_BATCHES=64 \
    NO_PACK=1 OUT=/tmp/g1/$1-$2 timeout 230 bash benchmarks/gpu_e2e.sh profile 2>&1 | tail -4
  find /tmp/tc-$1-$2 -name '*.json' -printf '%T+ %f\n' | sort > /tmp/g1/$1-$2/triton-cache.txt
done
tar czf $OUT/g1.tgz -C /tmp/g1 .
python3 - <<'PY'
import json, glob
for path in sorted(glob.glob("/tmp/g1/*/profile/*/metrics.jsonl")):
    for line in open(path):
        r = json.loads(line)
        if "step" in r and "time_s/step" in r:
            t = {k.split("/")[1]: round(v, 2) for k, v in r.items() if k.startswith("time_s/")}
            print(path.split("/")[3], r["step"], t)
for path in sorted(glob.glob("/tmp/g1/*/triton-cache.txt")):
    print(path.split("/")[3], "triton compiles:", sum(1 for _ in open(path)))
PY
