#!/usr/bin/env bash
# GPU measurements (kernel, whole steps, rollouts, dashboard, FSDP, GPU tests), as many as one machine session holds.
#
# Run from the repository root on a CUDA machine that has torch, triton, transformers, accelerate and
# peft (the device image), with the missing packages as wheels in .whl/ and GSM8K in .devdata/:
#   bash benchmarks/gpu_e2e.sh PHASE...     PHASE: tests kernel generation memory memory2 concurrent rollout dashboard profile steps decode decodeab sampling fsdp
#                                       export reallengths
# Results land in $OUT (default ./gpu-out): one folder per phase plus a log; a table is printed last.
set -uo pipefail
if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
ROOT=$PWD
source benchmarks/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

GSM8K=$ROOT/.devdata/gsm8k/test.jsonl
# The Qwen3-0.6B shape with random weights on GSM8K prompts: the end-to-end setup of benchmarks/results/e2e-h200/
# (completion 256, 8 generations, gradient checkpointing, beta 0.04, one micro-batch per step).
E2E_SETS=(--set model.name_or_path=builtin:qwen3-0.6b-shape --set "data.source=$GSM8K"
          --set grpo.gradient_accumulation_steps=1 --set grpo.max_completion_length=256
          --set grpo.gradient_checkpointing=true --set grpo.beta=0.04 --set logging.completions_per_step=0)
# EXTRA_SETS="k=v k=v": more overrides for every e2e phase (e.g. grpo.generation_backend=generate)
for item in ${EXTRA_SETS:-}; do E2E_SETS+=(--set "$item"); done

# The steps phase's default runs: trl and chunked with TRL's generate, chunked with the graph backend, and
# chunked + graph with every memory option (the lean setting), at batch 64 and 128.
LEAN=grpo.loss_sub_batch=32,grpo.activation_offload=true,grpo.generation_sub_batch=32,grpo.scoring_sub_batch=32
DEFAULT_STEP_SPECS="trl:trl:generate:64 chunked:chunked:generate:64 graph:chunked:graph:64 lean:chunked:graph:64:$LEAN
 trl:trl:generate:128 chunked:chunked:generate:128 graph:chunked:graph:128 lean:chunked:graph:128:$LEAN
 trl-graph:trl:graph:128"

# Built once per machine (cached under GRPO_TUI_CACHE_DIR); every trial reloads it from there.
build_model() { python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))"; }

for phase in "$@"; do
  echo "=== phase $phase $(date -u +%T)"
  case $phase in
    tests)
      timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/gpu} 2>&1 | tail -25 | tee "$OUT/gpu-tests.log"
      ;;
    generation)
      # Issue 13: rollout tokens/s per grpo.generation_backend, the sampling check and the bandwidth bound.
      build_model || exit 1
      # GEN_ARGS: more options (e.g. "--backend-batches static=128 --no-sampling static").
      timeout $(( ${GEN_BUDGET:-200} + 60 )) python3 benchmarks/generation_bench.py --data "$GSM8K" \
        --budget-s ${GEN_BUDGET:-200} ${GEN_ARGS:-} --out "$OUT/generation" 2>&1 | tail -24
      ;;
    kernel)
      timeout 330 python3 benchmarks/kernel/bench.py ${KERNEL_ARGS:---batch 8,32,64} --out "$OUT/kernel-h200.json" 2>&1 | tail -30
      ;;
    memory)
      build_model || exit 1
      timeout 420 python3 -m grpo_tui.cli bench memory qwen3-0.6b-gsm8k "${E2E_SETS[@]}" \
        --batch "${MEM_BATCH:-16,64,128}" --impl chunked,naive,trl --steps 2 \
        --runs-dir /tmp/runs-mem --out "$OUT/memory" 2>&1 | tail -20
      ;;
    memory2)
      # Second pass: the implementations and batches the first pass did not reach.
      timeout 200 python3 -m grpo_tui.cli bench memory qwen3-0.6b-gsm8k "${E2E_SETS[@]}" \
        --batch 16,64,128 --impl chunked --steps 2 --runs-dir /tmp/runs-mem --out "$OUT/memory-chunked" 2>&1 | tail -8
      timeout 130 python3 -m grpo_tui.cli bench memory qwen3-0.6b-gsm8k "${E2E_SETS[@]}" \
        --batch 128 --impl naive,trl --steps 2 --runs-dir /tmp/runs-mem --out "$OUT/memory-128" 2>&1 | tail -6
      ;;
    concurrent)
      # Max batch under a 24 GiB cap (memory only, so the searches may share the GPU) and the reward
      # parity runs of the tiny model, all at once.
      build_model || exit 1
      timeout 230 python3 -m grpo_tui.cli max-batch qwen3-0.6b-gsm8k "${E2E_SETS[@]}" --impl chunked \
        --memory-cap 24 --start 128 --multiple 32 --limit 1024 --runs-dir /tmp/runs-mb-chunked \
        --out "$OUT/maxbatch-chunked" > "$OUT/maxbatch-chunked.log" 2>&1 &
      timeout 230 python3 -m grpo_tui.cli max-batch qwen3-0.6b-gsm8k "${E2E_SETS[@]}" --impl naive \
        --memory-cap 24 --start 32 --multiple 8 --limit 256 --runs-dir /tmp/runs-mb-naive \
        --out "$OUT/maxbatch-naive" > "$OUT/maxbatch-naive.log" 2>&1 &
      for impl in chunked naive; do
        timeout 230 python3 -m grpo_tui.cli run tiny-cpu --headless --runs-dir /tmp/runs-parity-$impl \
          --set distributed.use_cpu=false --set loss.impl=$impl --set "grpo.max_steps=${PARITY_STEPS:-150}" \
          --set model.dtype=bfloat16 > /tmp/parity-$impl.log 2>&1 &
      done
      wait
      mkdir -p "$OUT/parity"
      for impl in chunked naive; do
        cp /tmp/runs-parity-$impl/*/metrics.jsonl "$OUT/parity/$impl.jsonl"; tail -1 /tmp/parity-$impl.log
      done
      tail -n 4 "$OUT"/maxbatch-*.log  # -n: "tail -4" with several files fails
      ;;
    rollout)
      # Issue 6 item 3: the rollout's peak with generation/scoring in sub-batches, then the whole step.
      build_model || exit 1
      timeout 300 python3 benchmarks/rollout_memory.py qwen3-0.6b-gsm8k --rollout 128 \
        --settings none,gen=32,gen=16,gen=32+score=32 "${E2E_SETS[@]}" --out "$OUT/rollout" 2>&1 | tail -6
      timeout 250 python3 -m grpo_tui.cli bench memory qwen3-0.6b-gsm8k "${E2E_SETS[@]}" \
        --set grpo.generation_sub_batch=32 --batch 64,128 --impl chunked --steps 2 \
        --runs-dir /tmp/runs-mem-sub --out "$OUT/memory-subbatch" 2>&1 | tail -6
      ;;
    dashboard)
      # Issue 15 item 10: the dashboard on a real GPU run (screenshots before/after a live switch, NVML
      # cost per GPU, the app's CPU while watching). Small steps so the switch shows within a minute.
      build_model || exit 1
      timeout 300 python3 benchmarks/gpu_dashboard.py --out "$OUT/dashboard" "${E2E_SETS[@]}" \
        --set grpo.per_device_batch_size=16 --set grpo.max_completion_length=128 --set grpo.max_steps=200 \
        --set 'rewards.functions=[{name="gsm8k_format",weight=1.0},{name="length_penalty",weight=1.0}]' 2>&1 | tail -4
      ;;
    profile)
      # The chunked-vs-trl step-time gap: each impl and batch a fresh headless run whose step
      # records carry per-phase times (time_s/*); at batch 64, step PROFILE_STEP (default 3) also runs under
      # torch.profiler (GRPO_TUI_PROFILE_STEP) and its operator tables land in the run folder. Each run has
      # its own Triton cache, listed with timestamps (a compile inside a step shows there). ~6 min on an H200.
      build_model || exit 1
      # An impl listed twice runs twice (the second as "<impl>-2"): torch.compile's cache is warm by then.
      labels=(); plain=()
      for impl in ${PROFILE_IMPLS:-chunked trl}; do
        for batch in ${PROFILE_BATCHES:-64 128}; do
          steps=2; profile=
          if [ "$batch" = 64 ]; then profile=${PROFILE_STEP:-3}; steps=$(( profile > 3 ? profile : 3 )); fi
          name=$impl-$batch
          [ -e "$OUT/profile/$name" ] && name=$impl-2-$batch
          runs=/tmp/runs-profile-$name
          rm -rf "$runs" "/tmp/triton-$name"
          TRITON_CACHE_DIR=/tmp/triton-$name GRPO_TUI_PROFILE_STEP=$profile timeout 200 python3 -m grpo_tui.cli run qwen3-0.6b-gsm8k --headless \
            "${E2E_SETS[@]}" --set loss.impl=$impl --set grpo.per_device_batch_size=$batch \
            --set grpo.max_steps=$steps --set logging.save_steps=0 --runs-dir "$runs" > "$OUT/profile-$name.log" 2>&1
          echo "$name: exit $? $(tail -1 "$OUT/profile-$name.log")"
          mkdir -p "$OUT/profile/$name"
          cp "$runs"/*/metrics.jsonl "$runs"/*/profile-step*.txt "$OUT/profile/$name/" 2>/dev/null
          find "/tmp/triton-$name" -name '*.json' ! -name '__grp__*' -printf '%T+ %f\n' | sort \
            > "$OUT/profile/$name/triton-compiles.txt"
          if [ -n "$profile" ]; then labels+=("${name%-$batch}/$batch=$OUT/profile/$name")
          else plain+=("${name%-$batch}/$batch=$OUT/profile/$name"); fi
        done
      done
      # The profiled step is left out of the profiled runs' rows only (the others ran no profiler)
      python3 benchmarks/step_times.py --skip-step ${PROFILE_STEP:-3} --out "$OUT/profile/step-times.json" "${labels[@]}" \
        | tee "$OUT/profile/step-times.md"
      [ ${#plain[@]} -gt 0 ] && python3 benchmarks/step_times.py --out "$OUT/profile/step-times-unprofiled.json" \
        "${plain[@]}" | tee -a "$OUT/profile/step-times.md"
      ;;
    steps)
      # Issues 12 and 13: whole steps per loss impl, generation backend and memory option, each a fresh
      # headless run of STEP_COUNT steps (default 2; step 2 reported, or with more steps the mean of steps 2
      # on), one after the other. STEP_SPECS: "label:impl:backend:batch[:k=v,...]".
      # STEP_WARMUP: specs run first (same step count) and not reported. The first process on a machine pays one-time
      # compiles that later ones find cached (torch.compile's kernels, and cuDNN's attention kernels, which
      # the driver JIT-compiles: 2.4 s of host time in a step, measured on the H200); without a warm-up that
      # cost lands on whichever spec runs first.
      build_model || exit 1
      count=${STEP_COUNT:-2}
      # run_spec SPEC LOG: one fresh headless run of SPEC ("label:impl:backend:batch[:k=v,...]") into
      # $runs, its output to $OUT/LOG-<label>-<batch>.log (LOG empty: dropped); sets label, batch and runs
      run_spec() {
        IFS=: read -r label impl backend batch extra <<< "$1"
        local sets=(--set loss.impl=$impl --set grpo.generation_backend=$backend --set grpo.per_device_batch_size=$batch)
        for item in ${extra//,/ }; do sets+=(--set "$item"); done
        runs=/tmp/runs-steps-$label-$batch
        rm -rf "$runs"
        local log=/dev/null; [ -n "$2" ] && log="$OUT/$2-$label-$batch.log"
        timeout ${STEP_TIMEOUT:-150} python3 -m grpo_tui.cli run qwen3-0.6b-gsm8k --headless "${E2E_SETS[@]}" "${sets[@]}" \
          --set grpo.max_steps=$count --set logging.save_steps=0 --runs-dir "$runs" > "$log" 2>&1
      }
      for spec in ${STEP_WARMUP:-}; do
        run_spec "$spec" ""
        echo "warm-up $label batch $batch: exit $?"
      done
      labels=()
      for spec in ${STEP_SPECS:-$DEFAULT_STEP_SPECS}; do
        run_spec "$spec" steps
        echo "$label batch $batch: exit $? $(tail -1 "$OUT/steps-$label-$batch.log")"
        mkdir -p "$OUT/steps"
        cp "$runs"/*/metrics.jsonl "$OUT/steps/$label-$batch.jsonl" 2>/dev/null
        labels+=("$label/$batch=$OUT/steps/$label-$batch.jsonl")
      done
      mean=(); [ "$count" -gt 2 ] && mean=(--mean)
      python3 benchmarks/step_times.py "${mean[@]}" --out "$OUT/steps/step-times.json" "${labels[@]}" | tee "$OUT/steps/step-times.md"
      ;;
    decode)
      # Rollouts of the Qwen3-0.6B shape against the memory-bandwidth bound: the trainer's graph (the fused forward
      # on the decode copy) beside transformers' forward on the live weights (graph-hf), each profiled once
      # (device time per kind of kernel); 16 and 128 x 256, then 64 x 1024. DECODE_BACKENDS: the backends at 256
      # tokens; DECODE_LONG_BACKENDS: at 1024 (default the same).
      build_model || exit 1
      timeout ${DECODE_TIMEOUT:-200} python3 benchmarks/generation_bench.py --data "$GSM8K" --budget-s 170 \
        --backends ${DECODE_BACKENDS:-graph,graph-hf} --batches 16,128 --backend-batches graph-hf=128 --no-sampling graph,graph-hf \
        --profile-batch 128 ${DECODE_ARGS:-} --out "$OUT/decode-256" > "$OUT/decode-256.log" 2>&1
      tail -7 "$OUT/decode-256.log"
      timeout ${DECODE_LONG_TIMEOUT:-150} python3 benchmarks/generation_bench.py --data "$GSM8K" --budget-s 120 \
        --backends ${DECODE_LONG_BACKENDS:-${DECODE_BACKENDS:-graph,graph-hf}} --batches 64 --new-tokens 1024 --no-sampling graph,graph-hf --profile-batch 64 \
        --profile-backends graph \
        ${DECODE_ARGS:-} --out "$OUT/decode-1024" > "$OUT/decode-1024.log" 2>&1
      tail -5 "$OUT/decode-1024.log"
      ;;
    decodeab)
      # The decoder's settings side by side, each in its own process: the decode kernel's grid at the rollouts'
      # masks (rows from a left-padding offset below 200), then graph rollouts at DECODEAB_BATCHES x 256 (default
      # 128,16), one profiled at 128, per variant. DECODEAB_VARIANTS: NAME=ARGS items, ARGS generation_bench.py's
      # --attention, --inductor and --blas with ':' for spaces (default: base; torch's GEMMs through cuBLASLt;
      # inductor's combo kernels, which launch independent kernels as one, such as each layer's q, k and v
      # preparation; the GEMMs autotuned by inductor, with 240 s for its compiles); NAME@SECONDS=ARGS gives that
      # variant its own limit (default DECODEAB_TIMEOUT).
      # The variants named in DECODEAB_CODE (default base) log inductor's generated code (TORCH_LOGS=output_code)
      # into their .log: which ops each decode-step kernel fuses. DECODEAB_GRID=none skips the kernel grid.
      build_model || exit 1
      mkdir -p "$OUT/decodeab"
      if [ "${DECODEAB_GRID:-}" != none ]; then
        timeout ${DECODEAB_ATTN_TIMEOUT:-90} python3 benchmarks/decode_attention_bench.py \
          --shapes 128x512x384,128x512x300,16x512x384 --grid "${DECODEAB_GRID:-stages=2,3;warps=4;block=64;target=528,1056,2112,4224}" \
          --out "$OUT/decodeab/attention" > "$OUT/decodeab/attention.log" 2>&1
        grep '^{' "$OUT/decodeab/attention.log" | cut -c1-300
      fi
      for item in ${DECODEAB_VARIANTS:-base= lt=--blas:cublaslt combo=--inductor:combo_kernels autotune@240=--inductor:max_autotune_gemm}; do
        name=${item%%=*}; args=${item#*=}; limit=${DECODEAB_TIMEOUT:-150}
        if [[ $name == *@* ]]; then limit=${name#*@}; name=${name%%@*}; fi
        # An empty TORCH_LOGS stops torch at import: set it only where asked
        code=(); [[ " ${DECODEAB_CODE:-base} " == *" $name "* ]] && code=(TORCH_LOGS=output_code)
        env "${code[@]}" timeout $limit python3 benchmarks/generation_bench.py --data "$GSM8K" --budget-s $(( limit - 30 )) \
          --backends graph --batches ${DECODEAB_BATCHES:-128,16} --no-sampling graph --profile-batch 128 ${args//:/ } \
          --out "$OUT/decodeab/$name" > "$OUT/decodeab/$name.log" 2>&1
        echo "$name: $(grep '^graph ' "$OUT/decodeab/$name.log" | tr -s ' ' | cut -d' ' -f1-9 | tr '\n' '|')"
      done
      ;;
    sampling)
      # The graph decoder's draws against generate's (GRPOConfig's default sampling, bf16): >= 512 completions each,
      # the mean log-prob of the sampled tokens and the length distribution (sampling_check.py), and both backends'
      # tokens/s at 16 rows.
      build_model || exit 1
      timeout ${SAMPLING_TIMEOUT:-150} python3 benchmarks/generation_bench.py --data "$GSM8K" --budget-s 130 \
        --backends graph,generate --batches 16 --out "$OUT/sampling" > "$OUT/sampling.log" 2>&1
      tail -6 "$OUT/sampling.log"
      ;;
    fsdp)
      # Whole steps of the FSDP + LoRA preset (Qwen3-1.7B shape, 1 process) per rollout path: FSDP2 on the decode
      # copy (keep, free), no FSDP (LoRA merged, unmerged, no LoRA) and TRL as a LoRA user has it.
      python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-1.7b-shape'))" || exit 1
      timeout ${FSDP_TIMEOUT:-560} python3 benchmarks/fsdp_rollouts.py --data "$GSM8K" --out "$OUT/fsdp" \
        ${FSDP_ARGS:-} 2>&1 | tail -12
      ;;
    export)
      # Export time and size of a Qwen3-0.6B-shape LoRA run: the adapter as it is, and merged into the base.
      mkdir -p "$OUT/export"
      timeout ${EXPORT_TIMEOUT:-240} python3 benchmarks/export_bench.py --repeats 2 --out "$OUT/export/export.json" 2>&1 | tail -6
      ;;
    reallengths)
      # Realistic completion lengths: the rollout alone (to the cap, finished rows kept, compacted), whole steps
      # (ours, TRL's head on our rollouts, TRL as a user has it, ours to the cap) and the max batch under 24 GiB
      # against TRL's, at 128 x 1024. REAL_PARTS picks among "decode steps maxbatch" (default all);
      # REAL_SHAPES / REAL_STEP_SHAPES narrow them. The two max-batch searches share the GPU (each capped at
      # 24 GiB, memory only); ours with the sub-batch options a memory-bound user sets (REAL_OURS_SETS).
      parts=" ${REAL_PARTS:-decode steps maxbatch} "
      for part in $parts; do
        case $part in decode|steps|maxbatch) ;; *) echo "REAL_PARTS: got '$part'; allowed: decode steps maxbatch" >&2; exit 2 ;; esac
      done
      build_model || exit 1
      mkdir -p "$OUT/real"
      if [[ $parts == *" decode "* ]]; then
        timeout ${REAL_DECODE_TIMEOUT:-150} python3 benchmarks/real_lengths.py --data "$GSM8K" \
          --shapes ${REAL_SHAPES:-128x1024,64x2048} --out "$OUT/real" > "$OUT/real-lengths.log" 2>&1
        tail -6 "$OUT/real-lengths.log"
      fi
      if [[ $parts == *" steps "* ]]; then
        timeout ${REAL_STEP_TIMEOUT:-560} python3 benchmarks/real_length_steps.py --data "$GSM8K" --out "$OUT/real" \
          --shapes ${REAL_STEP_SHAPES:-0.6b:128x1024} ${REAL_STEP_ARGS:-} 2>&1 | tail -14
      fi
      if [[ $parts == *" maxbatch "* ]]; then
        for side in ours trl; do
          if [ $side = ours ]; then
            sets=(--impl chunked --set grpo.generation_backend=graph)
            for item in ${REAL_OURS_SETS:-grpo.generation_sub_batch=32 grpo.scoring_sub_batch=32}; do sets+=(--set "$item"); done
            search=(${REAL_OURS_SEARCH:---start 128 --multiple 64 --limit 256})
          else
            sets=(--impl trl --set grpo.generation_backend=generate --set grpo.padding_free=false)
            search=(${REAL_TRL_SEARCH:---start 48 --multiple 16 --limit 256})
          fi
          timeout ${REAL_MAXBATCH_TIMEOUT:-240} python3 -m grpo_tui.cli max-batch qwen3-0.6b-gsm8k "${E2E_SETS[@]}" \
            --set grpo.max_completion_length=1024 "${sets[@]}" --lengths realistic --memory-cap 24 "${search[@]}" \
            --runs-dir /tmp/runs-mb-real-$side --out "$OUT/real/maxbatch-$side" > "$OUT/real/maxbatch-$side.log" 2>&1 &
        done
        wait
        tail -n 3 "$OUT"/real/maxbatch-*.log
      fi
      ;;
    *) echo "unknown phase $phase; allowed: tests kernel generation memory memory2 concurrent rollout dashboard profile steps decode decodeab sampling fsdp export reallengths" >&2; exit 2 ;;
  esac
done
echo "=== done $(date -u +%T)"
# The device returns at most 8 files: pack everything into one archive, but the trained models and checkpoints of
# the runs the benchmarks keep under $OUT (a Qwen3-0.6B run saves 1.1 GiB: packing a few took past a call's limit).
if [ -z "${NO_PACK:-}" ]; then
  tar czf /tmp/gpu-out.tgz --exclude='*/runs/*/model' --exclude='*/runs/*/checkpoints' -C "$OUT" . \
    && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu-out.tgz "$OUT/"
fi
