#!/usr/bin/env bash
# Call A (2026-12-03d): graph decoder with the exact-length cache (dynamic length), chunked prefill, one side
# stream: GPU generation tests, then rollouts per backend at 16/128/512 with the peak trace of a whole
# training-like rollout at 128 and 16.
set -uo pipefail
R=/tmp/rA; rm -rf $R; mkdir -p $R
pack() { tar czf $OUT/callA.tgz -C $R .; }
trap pack EXIT
source benchmarks/gpu_env.sh || exit 1
echo "== gpu generation tests $(date -u +%T)"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_generation_gpu.py > $R/gpu-tests-generation.log 2>&1; tail -3 $R/gpu-tests-generation.log
echo "== generation $(date -u +%T)"
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > $R/build.log 2>&1
timeout 330 python3 benchmarks/generation_bench.py --data .devdata/gsm8k/test.jsonl --budget-s 300 \
  --backends graph,generate --batches 16,128,512 --profile-batch 128 --no-sampling graph,generate \
  --out $R/generation > $R/gen.log 2>&1
python3 - <<'P'
import json
for line in open("/tmp/rA/gen.log"):
    if line.startswith("{"):
        r = json.loads(line)
        if "batch" in r:
            print(f"{r['backend']:9s} {r['batch']:4d} first {r['first_call_s']:6.1f}s  {r['tokens_per_s']:9.0f} tok/s  peak {r['peak_mib']:9.1f}  first-peak {r['first_call_peak_mib']:9.1f}")
P
for f in $R/generation/peak-*.txt; do echo "-- $f"; head -8 $f; done
echo "== done $(date -u +%T)"
