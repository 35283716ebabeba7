#!/usr/bin/env bash
# Call 2 (2026-12-03 session 2): whole steps, chunked vs trl after graph rollouts with warm caches (issue 12),
# and chunked with TRL's generate (issue 13's ratio); 3 steps each, mean of steps 2-3.
set -u
mkdir -p /tmp/c2
STEP_COUNT=3 STEP_WARMUP="warm:trl:graph:64 warm:trl:graph:128" \
STEP_SPECS="chunked-graph:chunked:graph:64 trl-graph:trl:graph:64 chunked-graph:chunked:graph:128 trl-graph:trl:graph:128 chunked-generate:chunked:generate:64 chunked-generate:chunked:generate:128" \
  NO_PACK=1 OUT=/tmp/c2 timeout 560 bash benchmarks/gpu_e2e.sh steps 2>&1 | tail -16
tar czf $OUT/c2.tgz -C /tmp/c2 .
