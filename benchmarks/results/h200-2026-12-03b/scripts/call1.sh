#!/usr/bin/env bash
# Call 1 (2026-12-03 session 2): chunked's step-2 loss after graph rollouts (cold vs warm torch.compile
# cache, step 2 profiled, gc pauses, Triton compiles), then sdpa's kernels for the decode attention.
set -u
mkdir -p /tmp/c1
export EXTRA_SETS=grpo.generation_backend=graph
PROFILE_STEP=2 PROFILE_IMPLS="chunked trl chunked" PROFILE_BATCHES="64 128" NO_PACK=1 OUT=/tmp/c1 \
  timeout 370 bash benchmarks/gpu_e2e.sh profile 2>&1 | grep -v "^|" | tail -8
unset EXTRA_SETS
GEN_BUDGET=150 GEN_ARGS="--backends graph,graph@efficient,graph@math --batches 128 \
  --no-sampling graph,graph@efficient,graph@math" NO_PACK=1 OUT=/tmp/c1 \
  timeout 205 bash benchmarks/gpu_e2e.sh generation 2>&1 | tail -12
tar czf $OUT/c1.tgz -C /tmp/c1 .
python3 - <<'PY'
import json, glob, re
for d in sorted(glob.glob("/tmp/c1/profile/*/")):
    name = d.rstrip("/").split("/")[-1]
    for line in open(d + "metrics.jsonl"):
        r = json.loads(line)
        if "time_s/step" in r:
            t = " ".join(f"{k.split('/')[1][:4]} {v:.2f}" for k, v in sorted(r.items()) if k.startswith("time_s/"))
            print(f"{name:16} step {r['step']} {t} len {r.get('completions/mean_length', 0):.0f}")
    for f in glob.glob(d + "profile-step*.txt"):
        print(f"{name:16}", [l.strip() for l in open(f) if l.startswith("gc pauses")][0])
    print(f"{name:16} triton compiles:", open(d + "triton-compiles.txt").read().split("\n")[-6:])
PY
