#!/usr/bin/env bash
# Call 3 (2026-12-03c): whole steps, chunked, graph (hoisted decode kernel) vs generate at 64 and 128, warmed.
D=$OUT; export OUT=/tmp/r3; rm -rf $OUT
NO_PACK=1 STEP_COUNT=3 STEP_WARMUP="w:chunked:graph:64" \
  STEP_SPECS="graph:chunked:graph:64 generate:chunked:generate:64 graph:chunked:graph:128 generate:chunked:generate:128" \
  timeout 570 bash benchmarks/gpu_e2e.sh steps
tar czf $D/call3.tgz -C /tmp/r3 .
