#!/usr/bin/env bash
# Call C (2026-12-03d): rollouts per backend at 16/128/512 in one run (graph with 64-column prefill chunks), then
# whole training steps, chunked, graph vs generate at 64 and 128 (generation-phase peaks and step times).
set -uo pipefail
R=/tmp/rC; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callC.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
echo "== generation $(date -u +%T)"
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > $R/build.log 2>&1
timeout 250 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 235 \
  --backends graph,generate --batches 16,128,512 --no-sampling graph,generate --out $R/generation > $R/gen.log 2>&1
python3 - <<'P'
import json
for line in open("/tmp/rC/gen.log"):
    if line.startswith("{"):
        r = json.loads(line)
        if "batch" in r:
            print(f"{r['backend']:9s} {r['batch']:4d} first {r['first_call_s']:6.1f}s  {r['tokens_per_s']:9.0f} tok/s  {100*r['bound_fraction']:5.1f}% of bound  peak {r['peak_mib']:9.1f}  first-peak {r['first_call_peak_mib']:9.1f}")
P
echo "== steps $(date -u +%T)"
D=$OUT; export OUT=$R
NO_PACK=1 STEP_COUNT=2 STEP_TIMEOUT=110 \
  STEP_SPECS="graph:chunked:graph:64 generate:chunked:generate:64 graph:chunked:graph:128 generate:chunked:generate:128" \
  timeout 300 bash benchmarks/gpu_e2e.sh steps > $R/steps.log 2>&1
export OUT=$D
tail -8 $R/steps.log
python3 - <<'P'
import json, glob
for f in sorted(glob.glob("/tmp/rC/steps/*.jsonl")):
    rows = [json.loads(l) for l in open(f) if l.strip()]
    for r in rows:
        if "step" in r and "memory" in r:
            print(f.split("/")[-1], r["step"], "step_s", r.get("time_s/step"), "gen_s", r.get("time_s/generation"), "phases", r["memory"].get("phases"))
P
echo "== done $(date -u +%T)"
