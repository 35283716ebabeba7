#!/usr/bin/env bash
# Call G (fifth session, issue 14 item 5), run inline on the machine call F left warm (this is its command,
# one line there): warm whole steps, chunked vs trl, graph rollouts, at 64 and 128.
R=/tmp/rG; rm -rf $R; mkdir -p $R; source benchmarks/gpu_env.sh || exit 1; D=$OUT; export OUT=$R; NO_PACK=1 STEP_COUNT=3 STEP_TIMEOUT=100 STEP_WARMUP="w:chunked:graph:64" STEP_SPECS="trl:trl:graph:64 chunked:chunked:graph:64 trl:trl:graph:128 chunked:chunked:graph:128" timeout 320 bash benchmarks/gpu_e2e.sh steps > $R/steps.log 2>&1; tar czf $D/callG.tgz -C $R .; tail -8 $R/steps.log
