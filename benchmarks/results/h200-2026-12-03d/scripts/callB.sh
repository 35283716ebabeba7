#!/usr/bin/env bash
# Call B (2026-12-03d): GPU tests (generation + kernels); row_stats geometry sweep (per-lane kernel vs the one
# before 9dee75e); the padded kernel bench; rollouts per backend (graph 16/128/512 with 32-column prefill
# chunks, generate at 512) with the peak trace at 128.
set -uo pipefail
R=/tmp/rB; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callB.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
echo "== gpu tests $(date -u +%T)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu > $R/gpu-tests.log 2>&1; tail -3 $R/gpu-tests.log
echo "== row_stats sweep $(date -u +%T)"
timeout 60 python3 .scratch/stats_sweep.py 1489 $R/stats-sweep.json > $R/stats-sweep.log 2>&1; cat $R/stats-sweep.log | cut -c1-150
echo "== kernel bench $(date -u +%T)"
timeout 150 python3 -m grpo_kernels.bench --padding 0,50,75 --valid-tokens 4096,32768 --scoring --providers floor,trl,chunked \
  --reps 20 --out $R/padded.json > $R/padded.log 2>&1; tail -30 $R/padded.log
echo "== generation $(date -u +%T)"
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > $R/build.log 2>&1
timeout 200 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 180 \
  --backends graph,generate --batches 16,128,512 --backend-batches generate=512 --profile-batch 128 \
  --no-sampling graph,generate --out $R/generation > $R/gen.log 2>&1
python3 - <<'P'
import json
for line in open("/tmp/rB/gen.log"):
    if line.startswith("{"):
        r = json.loads(line)
        if "batch" in r:
            print(f"{r['backend']:9s} {r['batch']:4d} first {r['first_call_s']:6.1f}s  {r['tokens_per_s']:9.0f} tok/s  peak {r['peak_mib']:9.1f}  first-peak {r['first_call_peak_mib']:9.1f}")
P
head -8 $R/generation/peak-graph-128.txt
echo "== done $(date -u +%T)"
