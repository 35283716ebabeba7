"""Training entry: `accelerate launch ... -m grpo_tui.train --run-dir RUN`.

Reads RUN/config.toml (the resolved preset), builds model, tokenizer, prompts and rewards, and trains a
`GrpoTuiTrainer`. Only the main process writes RUN/metrics.jsonl and RUN/completions.jsonl:
    start     once, listing every rank's {rank, local_rank, pid, device} (gathered from all ranks), so the
              dashboard can map PIDs to GPUs;
    step      records as metrics.py documents (memory: every rank's GPUs, phase peaks = max over ranks);
    loss_impl_switch / stop_requested / control_error  from control.json, read by rank 0 at each step
              boundary and broadcast, so every rank acts on the same request at the same step;
    finish, error (one line + exception type), oom (phase, step, memory).
Exit codes: 0 finished or stopped on request, 1 error, 2 bad configuration, 3 out of memory.
SIGINT asks for a stop at the next step boundary, like `{"stop": true}`; a second SIGINT interrupts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import MetricsWriter
from grpo_tui.train.control import ControlDecision, ControlReader

EXIT_OK, EXIT_ERROR, EXIT_CONFIG, EXIT_OOM = 0, 1, 2, 3


def resolve_model(preset: Preset) -> str:
    """A path or hub id TRL can load; builds a built-in model (tiny, or a real shape) on first use."""
    from grpo_tui.tasks.tiny import BUILTIN_MODEL, ensure_tiny_model

    name = preset.model.name_or_path
    if name == BUILTIN_MODEL:
        return str(ensure_tiny_model())
    if name.startswith("builtin:"):
        from grpo_tui.tasks.shapes import QWEN3_SHAPES, build_shaped_model

        shape = name.removeprefix("builtin:")
        if shape not in QWEN3_SHAPES:
            allowed = ", ".join([BUILTIN_MODEL, *(f"builtin:{s}" for s in QWEN3_SHAPES)])
            raise ValueError(f"model.name_or_path: unknown built-in {name!r}; allowed: {allowed}")
        return str(build_shaped_model(shape))
    if preset.model.config_only:
        from grpo_tui.tasks.tiny import ensure_random_model

        return str(ensure_random_model(name, trust_remote_code=preset.model.trust_remote_code))
    return name


def grpo_config(preset: Preset, run: RunDir) -> Any:
    from trl import GRPOConfig

    g, log = preset.grpo, preset.logging
    dtype = preset.model.dtype
    return GRPOConfig(
        output_dir=str(run.path / "checkpoints"),
        per_device_train_batch_size=g.per_device_batch_size,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        learning_rate=g.learning_rate,
        lr_scheduler_type=g.lr_scheduler_type,
        warmup_steps=g.warmup_steps,
        beta=g.beta,
        epsilon=g.epsilon_low,
        epsilon_high=g.epsilon_high,
        loss_type=g.loss_type,
        importance_sampling_level=g.importance_sampling_level,
        scale_rewards=g.scale_rewards,
        temperature=g.temperature,
        top_p=g.top_p,
        max_steps=g.max_steps,
        num_iterations=g.num_iterations,
        seed=g.seed,
        data_seed=g.seed,
        gradient_checkpointing=g.gradient_checkpointing,
        max_grad_norm=g.max_grad_norm,
        reward_weights=[spec.weight for spec in preset.rewards.functions],
        logging_steps=log.logging_steps,
        save_strategy="steps" if log.save_steps > 0 else "no",
        save_steps=max(log.save_steps, 1),
        report_to=[r for r in log.report_to if r != "none"] or "none",
        use_cpu=preset.distributed.use_cpu,
        bf16=preset.distributed.mixed_precision == "bf16",
        fp16=preset.distributed.mixed_precision == "fp16",
        model_init_kwargs={
            "dtype": dtype,
            "attn_implementation": preset.model.attn_implementation,
            "trust_remote_code": preset.model.trust_remote_code,
        },
        disable_tqdm=True,
        log_completions=False,
        # TRL 1.16 weights the KL term by the importance ratio by default; the chunked kernel's KL is the
        # plain k3 estimate. All three loss.impl must compute the same objective (they can be switched
        # live), so the plain KL is used throughout. No effect when beta == 0.
        use_bias_correction_kl=False,
        # The chunked loss uses the lm_head weight after DDP's forward; with unused-parameter search on
        # (the Trainer's default without gradient checkpointing), DDP marks lm_head unused at the forward's
        # end and its gradient then arrives "twice". Every parameter gets a gradient each step anyway.
        ddp_find_unused_parameters=False,
    )


def build_trainer(
    preset: Preset, run: RunDir, callbacks: list | None = None, on_step_logged: Any = None, on_event: Any = None
) -> Any:
    """The configured trainer (model, tokenizer, prompts, rewards) — used by train, check and tests."""
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from grpo_tui.tasks.data import build_prompt_dataset
    from grpo_tui.tasks.rewards import resolve_reward
    from grpo_tui.train.phase_memory import apply_memory_cap
    from grpo_tui.train.trainer import GrpoTuiTrainer

    state = PartialState()
    apply_memory_cap(state.device)
    with state.main_process_first():
        model_path = resolve_model(preset)
    from grpo_tui.tasks.tiny import BUILTIN_MODEL

    if preset.model.name_or_path == BUILTIN_MODEL and state.device.type == "cpu":
        import torch

        # One thread for the tiny model: its matrices are too small to split, and on a busy 2-core machine
        # two threads were measured 4x slower than one (82 s vs 17 s for the default run).
        torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=preset.model.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dataset = build_prompt_dataset(preset.data, tokenizer, preset.grpo.max_prompt_length)
    rewards = [resolve_reward(spec.name) for spec in preset.rewards.functions]
    peft_config = None
    if preset.peft.enabled:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=preset.peft.r,
            lora_alpha=preset.peft.alpha,
            lora_dropout=preset.peft.dropout,
            target_modules=list(preset.peft.target_modules),
            task_type="CAUSAL_LM",
        )
    trainer = GrpoTuiTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=grpo_config(preset, run),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
        loss_impl=preset.loss.impl,
        chunk_tokens=preset.loss.chunk_tokens,
        lean=preset.loss.lean,
        generation_sub_batch=preset.grpo.generation_sub_batch,
        generation_backend=preset.grpo.generation_backend,
        on_event=on_event,
        scoring_sub_batch=preset.grpo.scoring_sub_batch,
        on_step_logged=on_step_logged,
    )
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the runner prints its own line per step from metrics.jsonl
    return trainer


class TrainingSession:
    """One run: builds the trainer, writes the start/step/event records, acts on control requests."""

    def __init__(self, preset: Preset, run: RunDir, writer: MetricsWriter | None, state: Any) -> None:
        self.preset, self.run_dir, self.writer, self.state = preset, run, writer, state
        self.trainer: Any = None
        self.stop_reason: str | None = None
        self._sigint = False
        self._last_reward: dict[str, float] = {}
        self._completions = open(run.completions, "a", encoding="utf-8") if writer is not None else None
        self._control = ControlReader(run.control)

    @property
    def phases(self) -> Any:
        return self.trainer.phases if self.trainer is not None else None

    @property
    def step(self) -> int:
        return self.trainer.state.global_step if self.trainer is not None else 0

    def memory_now(self) -> dict[str, Any]:
        phases = self.phases
        return phases.snapshot(dict(phases.peaks)) if phases is not None else {}

    def run(self) -> int:
        from accelerate.utils import gather_object

        me = {
            "rank": self.state.process_index,
            "local_rank": self.state.local_process_index,
            "pid": os.getpid(),
            "device": str(self.state.device),
        }
        ranks = gather_object([me]) if self.state.use_distributed else [me]
        self._event(
            "start",
            preset=self.preset.name,
            run=self.run_dir.name,
            ranks=ranks,
            num_processes=self.state.num_processes,
            loss_impl=self.preset.loss.impl,
            max_steps=self.preset.grpo.max_steps,
        )
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self.trainer = build_trainer(
                self.preset,
                self.run_dir,
                callbacks=[_step_boundary_callback(self)],
                on_step_logged=self._on_step_logged,
                on_event=self._event,
            )
            self.trainer.train()
        finally:
            signal.signal(signal.SIGINT, previous)
            if self._completions is not None:
                self._completions.close()
        self._event("finish", step=self.step, stopped=self.stop_reason is not None)
        return EXIT_OK

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # First Ctrl-C: stop at the next step boundary; a second one interrupts at once.
        self._sigint = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_step_logged(self, trainer: Any, logs: dict[str, Any]) -> None:
        from accelerate.utils import gather_object

        from grpo_tui.train.phase_memory import merge_snapshots

        snapshot = trainer.phases.snapshot(trainer.phases.take_step())
        snapshots = gather_object([snapshot]) if self.state.use_distributed else [snapshot]
        if self.writer is None:
            return
        record = {"step": trainer.state.global_step, **logs, "loss_impl": trainer.impl_of_step}
        # TRL logs rewards only on steps that generate; with num_iterations > 1 a step trains on the previous
        # generation batch again, so its record repeats that batch's reward (every record has one).
        for key in ("reward", "reward_std"):
            if record.get(key) is None and key in self._last_reward:
                record[key] = self._last_reward[key]
            elif record.get(key) is not None:
                self._last_reward[key] = record[key]
        record["memory"] = merge_snapshots(snapshots)
        self.writer.write(record)
        self._write_completions(trainer)

    def _write_completions(self, trainer: Any) -> None:
        keep = self.preset.logging.completions_per_step
        logs = trainer._logs  # TRL's record of the last generation batch (gathered across ranks)
        if not keep or self._completions is None or not logs["prompt"]:
            return
        prompts, completions, advantages = list(logs["prompt"]), list(logs["completion"]), list(logs["advantages"])
        rewards = {name: list(values) for name, values in logs["rewards"].items()}
        for i in range(min(keep, len(prompts))):
            row = {
                "step": trainer.state.global_step,
                "prompt": prompts[i],
                "completion": completions[i],
                "rewards": {name: values[i] for name, values in rewards.items() if i < len(values)},
                "advantage": advantages[i] if i < len(advantages) else None,
            }
            self._completions.write(json.dumps(row, default=str) + "\n")
        self._completions.flush()

    def at_step_boundary(self, control: Any) -> None:
        """Read control.json on rank 0, broadcast, and act on it on every rank."""
        from accelerate.utils import broadcast_object_list

        from grpo_tui.train.trainer import LossImplError

        decision = self._control.poll() if self.state.is_main_process else ControlDecision()
        sigint = self._sigint and self.stop_reason is None
        if self.state.use_distributed:
            decision, sigint = broadcast_object_list([decision, sigint], from_process=0)
        step = self.step
        if decision.error:
            self._event("control_error", step=step, message=decision.error)
        if decision.loss_impl and decision.loss_impl != self.trainer.loss_impl:
            try:
                previous = self.trainer.switch_loss_impl(decision.loss_impl)
                self._event(
                    "loss_impl_switch",
                    step=step,
                    **{"from": previous, "to": decision.loss_impl},
                    request_id=decision.request_id,
                )
            except LossImplError as exc:
                self._event("control_error", step=step, message=str(exc))
        if (decision.stop or sigint) and self.stop_reason is None:
            self.stop_reason = "sigint" if sigint and not decision.stop else "control"
            control.should_training_stop = True
            if self.preset.logging.save_steps > 0:
                control.should_save = True
            self._event("stop_requested", step=step, source=self.stop_reason, request_id=decision.request_id)

    def _event(self, name: str, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.event(name, **fields)


def _step_boundary_callback(session: TrainingSession) -> Any:
    from transformers import TrainerCallback

    class StepBoundary(TrainerCallback):
        """Optimizer-phase memory and control.json at each optimizer step boundary."""

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            session.trainer.phases.begin("optimizer")

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            session.trainer.phases.end("optimizer")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            session.at_step_boundary(control)
            return control

    return StepBoundary()


def main(argv: list[str] | None = None, hard_exit: bool = False) -> int:
    """Train one run folder; `hard_exit` (the command line) leaves a distributed run without interpreter teardown."""
    parser = argparse.ArgumentParser(prog="python -m grpo_tui.train", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    run = RunDir(args.run_dir.resolve())
    from accelerate import PartialState

    state = PartialState(cpu=_use_cpu_hint(run))
    writer = MetricsWriter(run.metrics) if state.is_main_process else None
    session, code = None, EXIT_ERROR
    try:
        preset = run.load_preset()
        session = TrainingSession(preset, run, writer, state)
        code = session.run()
    except Exception as exc:  # every failure becomes one line for the runner
        code = _report_failure(exc, writer, session)
    finally:
        if writer is not None:
            writer.close()
        _shutdown_distributed(state, healthy=code == EXIT_OK, hard_exit=hard_exit, code=code)
    return code


def _shutdown_distributed(state: Any, healthy: bool, hard_exit: bool = False, code: int = EXIT_OK) -> None:
    if not state.use_distributed:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if healthy:
        # Leave together: a gloo rank whose peer has already torn down its sockets can abort (SIGABRT)
        # in the transport's background thread, turning a finished run into a failed launch.
        dist.barrier()
    if hard_exit:
        # Everything is written (metrics closed, checkpoints saved). Tearing down gloo's process group or
        # the interpreter still aborted now and then on CPU ("terminate called without an active
        # exception", seen in CI after a finished run), so the process leaves without either. The Python
        # exit hooks still run first: report_to loggers (wandb, trackio) finish and upload there.
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    dist.destroy_process_group()


def _use_cpu_hint(run: RunDir) -> bool:
    # Under `ACCELERATE_USE_CPU=true accelerate launch --multi_gpu` a plain state reports no distribution
    # unless cpu=True; read the preset's flag before building anything heavy.
    try:
        return bool(run.load_preset().distributed.use_cpu) or os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
    except Exception:  # the real error is reported by main
        return os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"


def _report_failure(exc: BaseException, writer: MetricsWriter | None, session: Any) -> int:
    import torch

    from grpo_tui.runs.failures import one_line, oom_message
    from grpo_tui.tasks.data import DataError
    from grpo_tui.tasks.rewards import RewardError
    from grpo_tui.train.trainer import LossImplError

    if isinstance(exc, torch.OutOfMemoryError):
        phases = session.phases if session is not None else None
        phase = (phases.failed_phase or phases.current) if phases is not None else None
        step = session.step if session is not None else None
        memory = session.memory_now() if session is not None else {}
        message = oom_message(phase, step)
        # Any rank may run out; a non-main rank appends its one event itself (the main one may be stuck
        # waiting for it in a collective).
        oom_writer = writer
        if oom_writer is None and session is not None:
            oom_writer = MetricsWriter(session.run_dir.metrics)
        if oom_writer is not None:
            rank = session.state.process_index if session is not None else 0
            oom_writer.event("oom", phase=phase, step=step, memory=memory, message=message, rank=rank)
            if oom_writer is not writer:
                oom_writer.close()
        print(f"grpo-tui: {message}", file=sys.stderr)
        return EXIT_OOM
    traceback.print_exc()
    if writer is not None:
        writer.event("error", message=one_line(str(exc), limit=400) or type(exc).__name__, type=type(exc).__name__)
    return EXIT_CONFIG if isinstance(exc, (DataError, RewardError, LossImplError)) else EXIT_ERROR
