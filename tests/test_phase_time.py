"""Per-phase wall time: the innermost phase is charged, per optimizer step, merged over ranks."""

from __future__ import annotations

import io

import pytest

from grpo_tui.train import phase_memory


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def _phases(clock: FakeClock) -> phase_memory.PhaseMemory:
    return phase_memory.PhaseMemory("cpu", clock=clock)


def test_time_goes_to_the_innermost_phase() -> None:
    clock = FakeClock()
    phases = _phases(clock)
    with phases.track("loss"):
        clock.tick(1.0)  # loss
        with phases.track("scoring"):
            clock.tick(2.0)  # scoring
            with phases.track("generation"):
                clock.tick(4.0)  # generation
            clock.tick(8.0)  # scoring again
        clock.tick(16.0)  # loss again
    clock.tick(32.0)  # between phases (gradient clipping): in the step, in no phase
    with phases.track("optimizer"):
        clock.tick(64.0)
    clock.tick(1000.0)  # after the step (logging): in nothing
    times = phases.take_times()
    assert times == {
        "time_s/generation": 4.0,
        "time_s/scoring": 10.0,
        "time_s/loss": 17.0,
        "time_s/optimizer": 64.0,
        "time_s/step": 127.0,
    }
    assert phases.take_times() == {}  # a new collection; nothing ran since


def test_a_phase_that_did_not_run_is_zero_and_steps_are_averaged() -> None:
    clock = FakeClock()
    phases = _phases(clock)
    for loss_s in (1.0, 3.0):  # two optimizer steps in one record (logging_steps = 2), no generation
        with phases.track("loss"):
            clock.tick(loss_s)
        with phases.track("optimizer"):
            clock.tick(0.5)
    times = phases.take_times()
    assert times["time_s/generation"] == times["time_s/scoring"] == 0.0
    assert times["time_s/loss"] == 2.0 and times["time_s/optimizer"] == 0.5
    assert times["time_s/step"] == 2.5
    assert phases.steps_done == 2


def test_an_error_inside_nested_phases_closes_them_all_once() -> None:
    clock = FakeClock()
    phases = _phases(clock)
    with pytest.raises(RuntimeError):
        with phases.track("loss"):
            phases.begin("generation")  # never ended: the error leaves through loss
            clock.tick(3.0)
            raise RuntimeError("boom")
    clock.tick(5.0)
    times = phases.take_times()
    assert times["time_s/generation"] == 3.0 and times["time_s/loss"] == 0.0
    assert times["time_s/step"] == 3.0


def test_merge_times_is_the_mean_over_ranks() -> None:
    ranks = [
        {"time_s/generation": 4.0, "time_s/loss": 1.0, "time_s/step": 6.0},
        {"time_s/generation": 2.0, "time_s/loss": 3.0, "time_s/step": 6.0},
    ]
    merged = phase_memory.merge_times(ranks)
    assert merged == {"time_s/generation": 3.0, "time_s/loss": 2.0, "time_s/step": 6.0}
    assert merged["time_s/generation"] + merged["time_s/loss"] <= merged["time_s/step"]


def test_profile_step_env_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(phase_memory.PROFILE_STEP_ENV, raising=False)
    assert phase_memory.StepProfiler.from_env(tmp_path, cuda=False) is None
    monkeypatch.setenv(phase_memory.PROFILE_STEP_ENV, "0")
    with pytest.raises(ValueError, match="GRPO_TUI_PROFILE_STEP: got '0'; allowed"):
        phase_memory.StepProfiler.from_env(tmp_path, cuda=False)
    monkeypatch.setenv(phase_memory.PROFILE_STEP_ENV, "3")
    profiler = phase_memory.StepProfiler.from_env(tmp_path, cuda=False)
    assert profiler is not None and profiler.step == 3 and profiler.path.name == "profile-step3.txt"

