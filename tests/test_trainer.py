"""The trainer in-process on tiny-cpu: chunked == naive == trl, the live switch, stop, LoRA."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from grpo_tui.runs.folder import RunDir, write_json_atomic
from grpo_tui.runs.metrics import read_records, step_records
from grpo_tui.train import entry
from grpo_tui.train.assemble import build_trainer

TINY_PRESET = Path(__file__).resolve().parents[1] / "presets" / "grpo_tui_presets" / "tiny-cpu.toml"
# fp32 on the CPU: the three implementations differ only in summation order (~1e-7 relative); the
# absolute floor covers losses that are a cancellation of near-equal terms (|loss| ~ 1e-8).
REL, ABS = 1e-4, 1e-6


def make_run(root: Path, name: str, **sections: dict[str, Any]) -> RunDir:
    data = tomllib.loads(TINY_PRESET.read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    run = RunDir(root / name)
    run.path.mkdir(parents=True)
    run.config.write_text(tomli_w.dumps(data))
    return run


def run_steps(run: RunDir) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    code = entry.main(["--run-dir", str(run.path)])
    records = read_records(run.metrics)
    return code, step_records(records), [r for r in records if "event" in r]


@pytest.fixture(scope="module")
def impl_runs(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("impls")
    out = {}
    for impl in ("chunked", "naive", "trl"):
        code, steps, _ = run_steps(make_run(root, impl, grpo={"max_steps": 5}, loss={"impl": impl}))
        assert code == 0
        out[impl] = steps
    return out


@pytest.mark.parametrize("impl", ["naive", "trl"])
def test_chunked_matches_baseline_over_five_steps(impl_runs: dict, impl: str) -> None:
    chunked, other = impl_runs["chunked"], impl_runs[impl]
    assert [r["step"] for r in chunked] == [r["step"] for r in other] == [1, 2, 3, 4, 5]
    for a, b in zip(chunked, other, strict=True):
        assert a["loss_impl"] == "chunked" and b["loss_impl"] == impl
        for key in ("loss", "reward", "grad_norm", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=REL, abs=ABS), (a["step"], key)


def test_step_records_are_complete(impl_runs: dict) -> None:
    for record in impl_runs["chunked"]:
        for key in (
            "reward",
            "reward_std",
            "loss",
            "grad_norm",
            "learning_rate",
            "entropy",
            "num_tokens",
            "rewards/addition_partial/mean",
            "clip_ratio/region_mean",
            "completions/mean_length",
        ):
            assert isinstance(record[key], float), key
        memory = record["memory"]
        assert memory["device"] == "cpu" and memory["rss_mib"] > 0
        assert set(memory["phases"]) == {"generation", "scoring", "loss", "optimizer"}
        phase_times = [record[f"time_s/{phase}"] for phase in ("generation", "scoring", "loss", "optimizer")]
        assert all(seconds > 0 for seconds in phase_times), phase_times
        assert sum(phase_times) <= record["time_s/step"] + 1e-3  # rounding to 0.1 ms per field


def test_switch_and_malformed_control(tiny_model_path: Path, tmp_path: Path, impl_runs: dict) -> None:
    run = make_run(tmp_path, "switch", grpo={"max_steps": 4}, loss={"impl": "chunked"})
    write_json_atomic(run.control, {"loss_impl": "naive", "request_id": 1})
    code, steps, events = run_steps(run)
    assert code == 0
    assert [r["loss_impl"] for r in steps] == ["chunked", "naive", "naive", "naive"]
    switches = [e for e in events if e["event"] == "loss_impl_switch"]
    # The event names the first step computed with the new implementation, and comes after the
    # record of the step before it: a reader never sees the implementation flip back.
    assert switches == [{**switches[0], "step": 2, "from": "chunked", "to": "naive"}]
    order = [(r.get("event") or "step", r.get("step"), r.get("loss_impl")) for r in read_records(run.metrics)]
    at = order.index(("loss_impl_switch", 2, None))
    assert order[at - 1] == ("step", 1, "chunked") and order[at + 1] == ("step", 2, "naive")
    # Same numbers as the unswitched run: the switch changes how, not what, is computed
    for a, b in zip(steps, impl_runs["chunked"], strict=False):
        assert a["loss"] == pytest.approx(b["loss"], rel=REL, abs=ABS)

    bad = make_run(tmp_path, "bad", grpo={"max_steps": 3}, loss={"impl": "naive"})
    bad.control.write_text("{not json")
    code, steps, events = run_steps(bad)
    assert code == 0 and len(steps) == 3
    errors = [e for e in events if e["event"] == "control_error"]
    assert len(errors) == 1 and "not valid JSON" in errors[0]["message"]


def test_stop_request_ends_cleanly(tiny_model_path: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path, "stop", grpo={"max_steps": 50}, loss={"impl": "naive"})
    write_json_atomic(run.control, {"stop": True, "request_id": 3})
    code, steps, events = run_steps(run)
    assert code == 0
    assert [r["step"] for r in steps] == [1]
    names = [e["event"] for e in events]
    assert names == ["start", "stop_requested", "checkpoint", "finish"]  # a stop leaves a checkpoint to resume
    assert run.latest_checkpoint() == run.checkpoints / "checkpoint-1"
    assert events[-1]["stopped"] is True


def test_lora_chunked_matches_naive(tiny_model_path: Path, tmp_path: Path) -> None:
    lora = {"enabled": True, "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    results = {}
    for impl in ("chunked", "naive"):
        run = make_run(
            tmp_path, impl, grpo={"max_steps": 3, "learning_rate": 1e-2, "beta": 0.1}, loss={"impl": impl}, peft=lora
        )
        code, steps, _ = run_steps(run)
        assert code == 0
        results[impl] = steps
    for a, b in zip(results["chunked"], results["naive"], strict=True):
        for key in ("loss", "reward", "grad_norm", "kl"):
            assert a[key] == pytest.approx(b[key], rel=REL, abs=ABS), (a["step"], key)
    # beta > 0 with LoRA: the reference is the adapter-disabled base, so KL grows from 0 as adapters train
    assert results["chunked"][0]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert results["chunked"][-1]["kl"] > 0


def test_lora_on_lm_head_refused_with_chunked(tiny_model_path: Path, tmp_path: Path) -> None:
    run = make_run(
        tmp_path,
        "head",
        grpo={"max_steps": 2},
        loss={"impl": "chunked"},
        peft={"enabled": True, "target_modules": ["q_proj", "lm_head"]},
    )
    code, steps, events = run_steps(run)
    # TRL 1.16 itself refuses an adapter on lm_head (its fused head reads the plain weight too)
    assert code != 0 and steps == []
    error = [e for e in events if e["event"] == "error"][0]
    assert "lm_head" in error["message"] and "\n" not in error["message"]


def test_completions_file(impl_runs: dict, tmp_path: Path, tiny_model_path: Path) -> None:
    run = make_run(tmp_path, "comp", grpo={"max_steps": 2}, loss={"impl": "naive"}, logging={"completions_per_step": 5})
    assert run_steps(run)[0] == 0
    rows = [json.loads(line) for line in run.completions.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 5 + [2] * 5
    for row in rows:
        assert row["prompt"].endswith("=") and isinstance(row["completion"], str)
        assert 0.0 <= row["rewards"]["addition_partial"] <= 1.0 and isinstance(row["advantage"], float)


@pytest.mark.parametrize(
    "grpo",
    [
        # old-policy log-probs from the scoring pass (num_iterations 2), grpo's per-sequence mean, accumulation
        {"loss_type": "grpo", "num_iterations": 2, "per_device_batch_size": 16, "gradient_accumulation_steps": 2},
        # sequence-level importance sampling with bnpo and a KL term against the reference model
        {"loss_type": "bnpo", "importance_sampling_level": "sequence", "num_iterations": 2, "beta": 0.05},
        {"loss_type": "dr_grpo", "epsilon_high": 0.28},
    ],
    ids=["grpo-accum", "bnpo-sequence-kl", "dr_grpo"],
)
def test_chunked_matches_naive_across_loss_settings(tiny_model_path: Path, tmp_path: Path, grpo: dict) -> None:
    results = {}
    for impl in ("chunked", "naive"):
        run = make_run(tmp_path, impl, grpo={**grpo, "max_steps": 3, "learning_rate": 3e-3}, loss={"impl": impl})
        code, steps, _ = run_steps(run)
        assert code == 0
        results[impl] = steps
    for a, b in zip(results["chunked"], results["naive"], strict=True):
        for key in ("loss", "reward", "grad_norm", "entropy", "clip_ratio/region_mean", "clip_ratio/high_max"):
            assert a[key] == pytest.approx(b[key], rel=REL, abs=ABS), (a["step"], key)
        if grpo.get("beta"):
            assert a["kl"] == pytest.approx(b["kl"], rel=REL, abs=ABS)


def test_tiny_cpu_reward_rises(tiny_model_path: Path, tmp_path: Path) -> None:
    """A short version of the embedded default's learning claim (the full 400-step run gains ~+0.4)."""
    run = make_run(
        tmp_path, "learn", grpo={"max_steps": 150}, loss={"impl": "chunked"}, logging={"completions_per_step": 0}
    )
    code, steps, _ = run_steps(run)
    assert code == 0 and len(steps) == 150
    rewards = [r["reward"] for r in steps]
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert last >= first + 0.15, (first, last)


def test_control_reader_acts_once_and_reports_bad_files_once(tmp_path: Path) -> None:
    from grpo_tui.train.control import ControlReader

    path = tmp_path / "control.json"
    reader = ControlReader(path)
    assert reader.poll().empty  # no file yet
    write_json_atomic(path, {"loss_impl": "trl", "request_id": 1})
    first = reader.poll()
    assert first.loss_impl == "trl" and not first.stop and first.request_id == 1
    assert reader.poll().empty  # same request id: already acted on
    write_json_atomic(path, {"loss_impl": "trl", "stop": True, "request_id": 2})
    assert reader.poll().stop
    path.write_text("[1, 2]")
    assert "JSON object" in reader.poll().error
    assert reader.poll().empty  # the same bad content is reported once
    write_json_atomic(path, {"loss_impl": "fast", "request_id": 3})
    assert "allowed: chunked, naive, trl" in reader.poll().error
    write_json_atomic(path, {"stop": "yes", "request_id": 4})
    assert "stop must be true or false" in reader.poll().error
    write_json_atomic(path, {"stop": True})
    assert "request_id" in reader.poll().error


def test_phase_memory_charges_the_innermost_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from grpo_tui.train import phase_memory

    rss = iter([100.0, 100.0, 150.0, 400.0, 160.0, 170.0, 170.0] + [170.0] * 20)
    monkeypatch.setattr(phase_memory, "rss_mib", lambda: next(rss))
    monkeypatch.setattr(phase_memory, "_reset_rss_peak", lambda: False)  # the boundary-sampling fallback
    phases = phase_memory.PhaseMemory("cpu")
    assert not phases.rss_hwm
    with phases.track("loss"):  # start 100
        with phases.track("generation"):  # loss sampled at 100; generation starts at 150, ends at 400
            pass
        # loss resumes at 160, ends at 170
    peaks = phases.take_step()
    assert peaks == {"generation": 400.0, "loss": 170.0}
    assert phases.take_step() == {}
    with pytest.raises(torch.OutOfMemoryError):
        with phases.track("scoring"):
            raise torch.OutOfMemoryError("simulated")
    assert phases.failed_phase == "scoring"


def test_phase_memory_on_cpu_catches_a_spike_freed_before_the_phase_ends() -> None:
    import torch

    from grpo_tui.train import phase_memory

    phases = phase_memory.PhaseMemory("cpu")
    if not phases.rss_hwm:
        pytest.skip("no resettable RSS high-water mark on this kernel")
    with phases.track("scoring"):
        with phases.track("generation"):
            spike = torch.ones(96 * 2**20)  # 384 MiB, touched, then gone before the phase ends
            del spike
        after = phase_memory.rss_mib()
    peaks = phases.take_step()
    assert peaks["generation"] >= after + 300  # boundary samples alone would have missed it
    assert peaks["scoring"] < peaks["generation"] - 300  # the enclosing phase resumes with a fresh peak


def _trainer(tiny_model_path: Path, tmp_path: Path, name: str, **grpo: Any) -> Any:
    from grpo_tui.config.schema import Preset

    run = make_run(
        tmp_path, name, grpo={"max_steps": 2, "per_device_batch_size": 8, "num_generations": 4, "beta": 0.1, **grpo}
    )
    preset = Preset.model_validate(tomllib.loads(run.config.read_text()))
    return build_trainer(preset, run)


def _batch_sizes(module: Any, grad: bool | None = None) -> list[int]:
    import torch

    sizes: list[int] = []

    def hook(_module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if grad is None or torch.is_grad_enabled() == grad:
            sizes.append(ids.shape[0])

    module.register_forward_pre_hook(hook, with_kwargs=True)
    return sizes


def test_generation_sub_batch_slices_the_rollout_and_keeps_each_completion(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    trainer = _trainer(tiny_model_path, tmp_path, "gen", generation_sub_batch=3)
    trainer.generation_config.do_sample = False  # greedy: each completion is a function of its prompt alone
    prompts = [row["prompt"] for row in trainer.train_dataset.select(range(2)) for _ in range(4)]
    calls: list[int] = []
    generate = trainer.model.generate
    trainer.model.generate = lambda *a, **k: calls.append(k["input_ids"].shape[0]) or generate(*a, **k)
    sliced = trainer._generate(prompts)[1]
    assert calls == [3, 3, 2]
    trainer.generation_sub_batch, calls[:] = None, []
    whole = trainer._generate(prompts)[1]
    assert calls == [8]
    assert sliced == whole and len(whole) == 8 and all(len(c) > 0 for c in whole)


def test_scoring_sub_batch_slices_only_the_no_grad_forwards_and_keeps_the_loss(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    history = {}
    for name, size in (("whole", None), ("sliced", 3)):
        # padding_free off: its length groups would split the scoring forwards further (test_padding_free.py)
        sub_batch = {"scoring_sub_batch": size} if size else {}
        trainer = _trainer(tiny_model_path, tmp_path, name, padding_free=False, **sub_batch)
        # beta > 0 without LoRA: a reference copy, used only for scoring
        scoring, loss = _batch_sizes(trainer.ref_model.model), _batch_sizes(trainer.model.model, grad=True)
        trainer.train()
        assert scoring == ([3, 3, 2] * 2 if size else [8] * 2)  # 2 steps of 8 completions
        assert loss == [8] * 2  # the loss forward keeps the whole micro-batch
        history[name] = [r for r in trainer.state.log_history if "loss" in r]
    for a, b in zip(history["whole"], history["sliced"], strict=True):
        for key in ("loss", "kl", "grad_norm", "reward"):
            assert a[key] == pytest.approx(b[key], rel=REL, abs=ABS), key


def test_naive_entropy_is_a_metric_kept_out_of_the_loss_graph() -> None:
    import torch

    from grpo_tui.losses.naive import naive_logps_and_entropies

    logits = torch.randn(2, 3, 50, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 50, (2, 3))
    saved: dict[bool, int] = {}
    results = {}
    for grad in (False, True):
        sizes: list[int] = []

        def pack(t: torch.Tensor, sizes: list[int] = sizes) -> torch.Tensor:
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            results[grad] = naive_logps_and_entropies(logits, ids, 0.7, entropy_grad=grad)
        saved[grad] = sum(sizes)
    (logps, ent), (logps_g, ent_g) = results[False], results[True]
    assert logps.requires_grad and not ent.requires_grad and ent_g.requires_grad  # only an entropy bonus trains it
    assert saved[True] >= saved[False] + 2 * logits.numel()  # its [B, T, V] intermediates are not kept otherwise
    torch.testing.assert_close(ent, ent_g.detach())
    torch.testing.assert_close(logps, logps_g)
    assert naive_logps_and_entropies(logits, ids, 0.7, entropy=False)[1] is None


def test_profile_step_writes_the_operator_tables(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpo_tui.train.profiling import PROFILE_STEP_ENV

    monkeypatch.setenv(PROFILE_STEP_ENV, "2")
    run = make_run(tmp_path, "profiled", grpo={"max_steps": 2})
    code, steps, _ = run_steps(run)
    assert code == 0 and [r["step"] for r in steps] == [1, 2]
    table = (run.path / "profile-step2.txt").read_text()
    assert "optimizer step 2" in table and "cpu_time_total" in table and "gc pauses: " in table
    assert "aten::" in table  # operator rows, not just the header
    assert not (run.path / "profile-step1.txt").exists()


def test_sdpa_kernels_hold_every_forward_of_the_step(tiny_model_path: Path, tmp_path: Path) -> None:
    # model.sdpa_kernels: the step's forwards (rollout, scoring, loss) see only the named kernels and math;
    # outside the step, and without the field, torch's choice is back
    import torch

    from grpo_tui.config.schema import Preset

    b = torch.backends.cuda
    seen: dict[str, list[tuple[bool, bool, bool]]] = {}

    def record(flags: list[tuple[bool, bool, bool]]) -> Any:
        return lambda *_: flags.append((b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()))

    for name, kernels in (("held", ["efficient"]), ("free", [])):
        run = make_run(
            tmp_path,
            name,
            grpo={"max_steps": 1, "per_device_batch_size": 8, "num_generations": 4},
            model={"attn_implementation": "sdpa", "sdpa_kernels": kernels},
        )
        trainer = build_trainer(Preset.model_validate(tomllib.loads(run.config.read_text())), run)
        trainer.model.model.layers[0].self_attn.register_forward_pre_hook(record(seen.setdefault(name, [])))
        trainer.train()
        assert b.flash_sdp_enabled() and b.mem_efficient_sdp_enabled() and b.math_sdp_enabled()
    assert seen["held"] and set(seen["held"]) == {(False, True, True)}
    assert seen["free"] and set(seen["free"]) == {(True, True, True)}
