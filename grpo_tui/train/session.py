"""One training run's session: the start/step/event records and the control plane at step boundaries.

Only the main process writes RUN/metrics.jsonl and RUN/completions.jsonl:
    start     once, listing every rank's {rank, local_rank, pid, device} (gathered from all ranks), so the
              dashboard can map PIDs to GPUs;
    step      records as runs/metrics.py documents (memory: every rank's GPUs, phase peaks = max over ranks);
    loss_impl_switch / stop_requested / control_error  from control.json, read by rank 0 at each step
              boundary and broadcast, so every rank acts on the same request at the same step;
              written AFTER the record of the step that just ended. A switch names the first step computed
              with the new implementation (that step's record carries it), so a reader taking the newest of
              "last step record" and "last switch event" never sees the implementation flip back;
    supervisor_lost  when rank 0 finds the supervisor that started the run gone: every rank stops at that
              step boundary, as on a stop request (a run must not train on untracked and unstoppable);
    checkpoint  when a checkpoint is saved (every logging.save_steps, and at every stop so it can be resumed);
    resume    right after the start event of a resumed run (`--resume`: from the newest checkpoint, with
              its model, optimizer, scheduler, RNG and step); steps up to the last one already in the
              stream are recomputed from the checkpoint but not written again (no step appears twice);
    finish    when training ends (finished, or stopped on request or by a lost supervisor), after the final
              save: `model` names RUN/model/ and `model_bytes` its size (train/final_model.py). A save that
              fails is an error instead (the run fails with that line). With eval.at_end, a finished run is
              scored first (train/evaluate.py): `eval` holds eval.json's before/after, or `eval_error` a line.
SIGINT asks for a stop at the next step boundary, like `{"stop": true}`; a second SIGINT interrupts.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.heartbeat import COLLECTIVE
from grpo_tui.runs.jsonl import JsonlAppender
from grpo_tui.runs.metrics import MetricsWriter, last_step
from grpo_tui.train.assemble import build_trainer
from grpo_tui.train.control import ControlDecision, ControlReader, SupervisorWatch
from grpo_tui.train.heartbeat import HeartbeatThread


class TrainingSession:
    """One run: builds the trainer, writes the start/step/event records, acts on control requests."""

    def __init__(
        self, preset: Preset, run: RunDir, writer: MetricsWriter | None, state: Any, resume: bool = False
    ) -> None:
        self.preset, self.run_dir, self.writer, self.state = preset, run, writer, state
        self.resume = resume
        # The last step the stream already holds: a resumed run does not write those steps again
        self._recorded_up_to = (last_step(run.metrics) or 0) if resume else 0
        self.trainer: Any = None
        self.stop_reason: str | None = None
        self._sigint = False
        self._last_reward: dict[str, float] = {}
        self._completions = JsonlAppender(run.completions, sync=False) if writer is not None else None
        self._control = ControlReader(run.control)
        self._supervisor = SupervisorWatch()
        # Events decided at a step boundary wait for that step's record (see the module docstring)
        self._pending: list[tuple[str, dict[str, Any]]] = []
        # Every rank beats (runs/heartbeat.py): a hang names its rank and phase
        self.heartbeat = HeartbeatThread(run.path, state.process_index, lambda: self.phases, lambda: self.step)

    @property
    def phases(self) -> Any:
        return self.trainer.phases if self.trainer is not None else None

    @property
    def step(self) -> int:
        return self.trainer.state.global_step if self.trainer is not None else 0

    def memory_now(self) -> dict[str, Any]:
        phases = self.phases
        return phases.snapshot(dict(phases.peaks)) if phases is not None else {}

    def run(self) -> None:
        """Train to the end (or to a requested stop); failures propagate to the entry's report."""
        from accelerate.utils import gather_object

        me = {
            "rank": self.state.process_index,
            "local_rank": self.state.local_process_index,
            "pid": os.getpid(),
            "device": str(self.state.device),
        }
        checkpoint = self.run_dir.latest_checkpoint() if self.resume else None
        if self.resume and checkpoint is None:
            raise ValueError(f"{self.run_dir.checkpoints}: no checkpoint to resume from")
        self.heartbeat.start()
        try:
            self._train(gather_object([me]) if self.state.use_distributed else [me], checkpoint)
        finally:
            self.heartbeat.stop()

    def _train(self, ranks: list[dict[str, Any]], checkpoint: Path | None) -> None:
        self._event(
            "start",
            preset=self.preset.name,
            run=self.run_dir.name,
            ranks=ranks,
            num_processes=self.state.num_processes,
            loss_impl=self.preset.loss.impl,
            max_steps=self.preset.grpo.max_steps,
        )
        if checkpoint is not None:
            from_step = int(checkpoint.name.removeprefix("checkpoint-"))
            self._event("resume", from_step=from_step, checkpoint=str(checkpoint))
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self.trainer = build_trainer(
                self.preset,
                self.run_dir,
                callbacks=[_step_boundary_callback(self)],
                on_step_logged=self._on_step_logged,
                on_event=self._event,
            )
            self.trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        finally:
            signal.signal(signal.SIGINT, previous)
            if self._completions is not None:
                self._completions.close()
        self._flush_pending()
        saved = self._save_model()
        model = {"model": str(saved.path), "model_bytes": saved.bytes} if saved is not None else {}
        scores = self._evaluate() if self.preset.eval.at_end and self.stop_reason is None else {}
        self._event("finish", step=self.step, stopped=self.stop_reason is not None, **model, **scores)

    def _evaluate(self) -> dict[str, Any]:
        # A finished run's held-out scores (eval.at_end), on the main process: the model is saved already, so
        # a failure here is reported on the finish event and never fails the run.
        if self.writer is None:
            return {}
        from grpo_tui.runs.failures import exception_line
        from grpo_tui.train.evaluate import evaluate_run

        try:
            result = evaluate_run(self.run_dir, self.preset, device=self.state.device)
        except Exception as exc:  # any failure of the optional evaluation is one line on the finish event
            return {"eval_error": exception_line(exc)}
        return {"eval": {"reward": result["reward"], "rewards": result["rewards"]}}

    def _save_model(self) -> Any:
        from grpo_tui.train.final_model import save_final_model

        info = {
            "run": self.run_dir.name,
            "preset": self.preset.name,
            "step": self.step,
            "base_model": self.preset.model.name_or_path,
        }
        return save_final_model(self.trainer, self.run_dir.model, info)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # First Ctrl-C: stop at the next step boundary; a second one interrupts at once.
        self._sigint = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_step_logged(self, trainer: Any, logs: dict[str, Any]) -> None:
        from accelerate.utils import gather_object

        from grpo_tui.train.length_groups import share_fields
        from grpo_tui.train.phase_memory import generation_fields, merge_snapshots, merge_times

        mine = (
            trainer.phases.snapshot(trainer.phases.take_step()),
            trainer.phases.take_times(),
            trainer.rollouts.take_stats(),
            trainer.token_counts.take(),
        )
        with self.heartbeat.during(COLLECTIVE):
            per_rank = gather_object([mine]) if self.state.use_distributed else [mine]
        if self.writer is None:
            self._pending.clear()  # only the main process writes events
            return
        if trainer.state.global_step <= self._recorded_up_to:
            self._flush_pending()
            return  # recomputed after a resume from an earlier checkpoint; the stream has this step
        record = {"step": trainer.state.global_step, **logs, "loss_impl": trainer.impl_of_step}
        # TRL logs rewards only on steps that generate; with num_iterations > 1 a step trains on the previous
        # generation batch again, so its record repeats that batch's reward (every record has one).
        for key in ("reward", "reward_std"):
            if record.get(key) is None and key in self._last_reward:
                record[key] = self._last_reward[key]
            elif record.get(key) is not None:
                self._last_reward[key] = record[key]
        record["memory"] = merge_snapshots([snapshot for snapshot, *_ in per_rank])
        record.update(merge_times([times for _, times, *_ in per_rank]))
        record.update(generation_fields(trainer.rollouts.backend, [stats for _, _, stats, _ in per_rank], record))
        record.update(share_fields([counts for *_, counts in per_rank]))
        self.writer.write(record)
        self._flush_pending()
        self._write_completions(trainer)

    def _write_completions(self, trainer: Any) -> None:
        keep = self.preset.logging.completions_per_step
        logs = trainer._logs  # TRL's record of the last generation batch (gathered across ranks)
        if not keep or self._completions is None or not logs["prompt"]:
            return
        prompts, completions, advantages = list(logs["prompt"]), list(logs["completion"]), list(logs["advantages"])
        rewards = {name: list(values) for name, values in logs["rewards"].items()}
        rows = [
            {
                "step": trainer.state.global_step,
                "prompt": prompts[i],
                "completion": completions[i],
                "rewards": {name: values[i] for name, values in rewards.items() if i < len(values)},
                "advantage": advantages[i] if i < len(advantages) else None,
            }
            for i in range(min(keep, len(prompts)))
        ]
        self._completions.append(json.dumps(row, default=str) for row in rows)  # the step's rows, or none

    def at_step_boundary(self, control: Any) -> None:
        """Read control.json on rank 0, broadcast, and act on it on every rank."""
        from accelerate.utils import broadcast_object_list

        from grpo_tui.train.trainer import LossImplError

        main = self.state.is_main_process
        decision = self._control.poll() if main else ControlDecision()
        lost = self._supervisor.lost() if main and self.stop_reason is None else None
        sigint = self._sigint and self.stop_reason is None
        if self.state.use_distributed:
            with self.heartbeat.during(COLLECTIVE):
                decision, sigint, lost = broadcast_object_list([decision, sigint, lost], from_process=0)
        step = self.step
        if decision.error:
            self._pending.append(("control_error", {"step": step, "message": decision.error}))
        if decision.loss_impl and decision.loss_impl != self.trainer.loss_impl:
            try:
                previous = self.trainer.switch_loss_impl(decision.loss_impl)
                fields = {"step": step + 1, "from": previous, "to": decision.loss_impl}
                self._pending.append(("loss_impl_switch", {**fields, "request_id": decision.request_id}))
            except LossImplError as exc:
                self._pending.append(("control_error", {"step": step, "message": str(exc)}))
        if (decision.stop or sigint) and self.stop_reason is None:
            self._stop(control, "sigint" if sigint and not decision.stop else "control")
            fields = {"step": step, "source": self.stop_reason, "request_id": decision.request_id}
            self._pending.append(("stop_requested", fields))
        if lost and self.stop_reason is None:
            self._stop(control, "supervisor_lost")
            self._pending.append(("supervisor_lost", {"step": step, "message": lost}))
        # DefaultFlowCallback (first in the list) has decided by now whether this step gets a record.
        if not control.should_log:
            self._flush_pending()

    def _stop(self, control: Any, reason: str) -> None:
        self.stop_reason = reason
        control.should_training_stop = True
        # Every stop leaves a checkpoint, so `grpo-tui resume` can continue it (save_steps 0 included)
        control.should_save = True

    def _flush_pending(self) -> None:
        for name, fields in self._pending:
            self._event(name, **fields)
        self._pending.clear()

    def _event(self, name: str, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.event(name, **fields)


def _step_boundary_callback(session: TrainingSession) -> Any:
    # The class is made here so that importing this module (and the entry) does not import transformers
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

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            path = session.run_dir.checkpoints / f"checkpoint-{state.global_step}"
            session._event("checkpoint", step=state.global_step, path=str(path))

    return StepBoundary()
