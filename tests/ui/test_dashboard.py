"""The run dashboard, fed by recorded runs (grpo_tui.tools.demo) and a live writer; every binding."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import Switch, TabbedContent
from ui_support import SIZE, FakeMonitor, gpu_snapshot, mark_running, plain, wait_for, wait_for_exit

from grpo_tui.dashboard.screens.confirm import ConfirmScreen, QuitScreen
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.dashboard.screens.presets import PresetScreen
from grpo_tui.dashboard.widgets.completions_browser import CompletionsBrowser
from grpo_tui.dashboard.widgets.loss_impl_toggle import LossImplToggle
from grpo_tui.dashboard.widgets.metric_chart import MetricChart
from grpo_tui.dashboard.widgets.reward_chart import RewardChart
from grpo_tui.tools.demo import T0, LiveWriter, make_run, step_record


@pytest.fixture
def live_run(runs_dir: Path) -> Path:
    """10 steps so far, run.json naming a live process (this test's)."""
    run = make_run(runs_dir / "live", steps=10, finished=False).path
    mark_running(run)
    return run


async def open_dashboard(app, pilot, run: Path) -> DashboardScreen:
    app.open_run(run)
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
    return app.screen


async def test_recorded_run_draws_progress_charts_switch_and_phase_peaks(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, recorded_run)
        progress = plain(screen.query_one("#progress"))
        assert "step 300/300" in progress and "finished" in progress
        reward = screen.query_one(RewardChart)
        assert reward.xs[0] == 1 and reward.xs[-1] == 300
        assert set(reward.funcs) == {"addition_partial", "format"}
        titles = [c.title for c in screen.query(MetricChart) if not isinstance(c, RewardChart)]
        assert titles == ["loss", "KL", "entropy", "clip ratio", "completion length", "tokens/s"]
        assert screen.view.charts.switches == [150]
        peaks = plain(screen.query_one("#phase-peaks"))
        assert "before" in peaks and "after" in peaks and "loss" in peaks
        assert screen.view.switch_label == "chunked → naive at step 150"
        # naive (after the switch) holds more memory in the loss phase than chunked did before it
        loss = screen.view.phases["loss"]
        assert loss["after"] > loss["before"]


async def test_long_runs_are_downsampled_for_drawing_not_truncated(app_factory, runs_dir) -> None:
    run = make_run(runs_dir / "long", steps=3000, completions=False).path
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, run)
        await wait_for(pilot, lambda: not screen.view.partial)  # the first view may hold the newest steps only
        await pilot.pause(0.1)
        reward = screen.query_one(RewardChart)
        assert len(reward.xs) <= 400
        assert reward.xs[0] == 1 and reward.xs[-1] == 3000


async def test_no_gpu_path_shows_host_ram_and_cpu_and_says_so(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, recorded_run)
        panel = plain(screen.query_one("#gpu-panel"))
        assert "No GPU" in panel and "no NVIDIA driver" in panel
        assert "RAM" in panel and "6.0 GiB/23.5 GiB" in panel and "CPU  37%" in panel


async def test_gpu_rows_map_each_rank_pid_to_its_gpu(app_factory, runs_dir) -> None:
    run = make_run(runs_dir / "two-gpus", steps=20, n_gpus=2).path
    monitor = FakeMonitor(gpu_snapshot())
    app = app_factory(monitor=monitor)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, run)
        panel = plain(screen.query_one("#gpu-panel"))
        assert "GPU0" in panel and "GPU1" in panel and "NVIDIA H200" in panel
        assert "rank0 pid 424242" in panel and "rank1 pid 424243" in panel
        assert "util  87%" in panel and "61°C" in panel and "412 W" in panel
        assert set(monitor.calls[-1]) == {424242, 424243}  # the run's pids are what gets sampled


async def test_live_run_updates_as_steps_arrive(app_factory, runs_dir) -> None:
    run = make_run(runs_dir / "live", steps=10, finished=False, max_steps=1000).path
    mark_running(run)
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, run)
        assert screen.view.status == "running" and screen.view.progress.step == 10
        with LiveWriter(run, hz=40.0, start_step=11):
            await wait_for(pilot, lambda: screen.view.progress.step >= 20)
        assert screen.query_one(RewardChart).xs[-1] >= 20
        assert run in app.live_runs


async def test_t_and_the_switch_write_control_json(app_factory, live_run) -> None:
    run = live_run
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, run)
        await pilot.press("t")
        control = run / "control.json"
        await wait_for(pilot, lambda: control.exists())
        assert json.loads(control.read_text())["loss_impl"] == "naive"  # chunked -> the preset's baseline
        toggle = screen.query_one(LossImplToggle)
        await wait_for(pilot, lambda: toggle.pending == "naive")
        assert "naive at next step" in plain(toggle.query_one("#impl-state"))
        await pilot.press("t")  # pressing again asks to go back to chunked
        await wait_for(pilot, lambda: json.loads(control.read_text())["loss_impl"] == "chunked")
        await pilot.click("#impl-switch")  # the mouse works too
        await wait_for(pilot, lambda: json.loads(control.read_text())["loss_impl"] == "naive")
        assert json.loads(control.read_text())["request_id"] == 3


async def test_the_switch_event_clears_pending_and_is_marked(app_factory, live_run) -> None:
    run = live_run
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, run)
        await pilot.press("t")
        await wait_for(pilot, lambda: (run / "control.json").exists())
        rng = random.Random(0)
        with open(run / "metrics.jsonl", "a") as handle:  # what the trainer writes when it acts on it
            handle.write(
                json.dumps(
                    {
                        "v": 1,
                        "time": time.time(),
                        "event": "loss_impl_switch",
                        "step": 11,
                        "from": "chunked",
                        "to": "naive",
                    }
                )
                + "\n"
            )
            handle.write(json.dumps(step_record(11, rng, loss_impl="naive")) + "\n")
        await wait_for(pilot, lambda: screen.view.charts.switches == [11])
        toggle = screen.query_one(LossImplToggle)
        assert toggle.current == "naive" and toggle.pending is None
        assert toggle.query_one(Switch).value is False
        assert screen.view.switch_label == "chunked → naive at step 11"


@contextlib.contextmanager
def run_with_victim(runs_dir: Path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """A running run folder whose process group is a sleeping child (killed at the end if it survived)."""
    import psutil

    run = make_run(runs_dir / "live", steps=10, finished=False).path
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        mark_running(run)
        meta = json.loads((run / "run.json").read_text())
        meta.update(pgid=victim.pid, child_pid=victim.pid, child_started=psutil.Process(victim.pid).create_time())
        (run / "run.json").write_text(json.dumps(meta))
        yield run, victim
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


async def test_x_asks_then_requests_a_graceful_stop_and_a_second_x_kills(app_factory, runs_dir) -> None:
    with run_with_victim(runs_dir) as (run, victim):
        app = app_factory(clock=time.time)
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(app, pilot, run)
            await pilot.press("x")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")  # no: nothing written
            assert isinstance(app.screen, DashboardScreen) and not (run / "control.json").exists()
            await pilot.press("x")
            await pilot.press("y")
            await wait_for(pilot, lambda: (run / "control.json").exists())
            assert json.loads((run / "control.json").read_text())["stop"] is True
            assert victim.poll() is None  # graceful: the process is left to stop itself
            await pilot.press("x")
            assert "Kill" in plain(app.screen.query_one("#question"))
            await pilot.press("enter")
            await wait_for(pilot, lambda: victim.poll() is not None)
            assert victim.returncode == -signal.SIGTERM


async def test_x_in_the_stop_dialog_kills_at_once(app_factory, runs_dir) -> None:
    with run_with_victim(runs_dir) as (run, victim):
        app = app_factory(clock=time.time)
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(app, pilot, run)
            await pilot.press("x")
            assert "x kills its processes now" in plain(app.screen.query_one("#detail"))
            await pilot.press("x")  # what the dialog says x does
            await wait_for(pilot, lambda: victim.poll() is not None)
            assert victim.returncode == -signal.SIGTERM
            assert json.loads((run / "control.json").read_text())["kill"] is True


async def test_tabs_and_completion_steps(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, recorded_run)
        tabs = screen.query_one(TabbedContent)
        for key, tab in (("2", "tab-completions"), ("3", "tab-alerts"), ("4", "tab-log"), ("1", "tab-charts")):
            await pilot.press(key)
            assert tabs.active == tab
        browser = screen.query_one(CompletionsBrowser)
        await wait_for(pilot, lambda: browser.steps and browser.step == 300)
        await pilot.press("left_square_bracket")
        assert tabs.active == "tab-completions" and browser.step == 299 and not browser.follow
        body = screen.query_one("#completions-body")
        await wait_for(pilot, lambda: "group 1/2" in plain(body) and "advantage" in plain(body))
        assert "addition_partial" in plain(body)
        await pilot.press("home")
        assert browser.step == 1
        await pilot.press("right_square_bracket")
        assert browser.step == 2
        await pilot.press("end")
        assert browser.step == 300 and browser.follow


async def test_completions_read_after_the_app_closed_do_not_fail_it(app_factory, recorded_run) -> None:
    # Completions are read in a thread; a read finishing after the app or screen closed has nowhere to go
    from grpo_tui.dashboard.screens.dashboard import DashboardScreen

    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, recorded_run)
        await pilot.press("2")
        browser = screen.query_one(CompletionsBrowser)
        await wait_for(pilot, lambda: browser.steps and browser.step == 300)
    DashboardScreen._load_groups.__wrapped__(screen, 300)  # the worker's body: the app refuses the call back
    screen._show_groups(300, [])  # the UI-thread half: the dismantled screen has no browser


async def test_alerts_show_in_place_and_in_the_list(app_factory, runs_dir) -> None:
    run = runs_dir / "flat"
    make_run(run, steps=30, completions=False)
    rng = random.Random(1)
    with open(run / "metrics.jsonl", "a") as handle:  # ten steps where every group had the same reward
        for step in range(31, 41):
            record = step_record(step, rng)
            record["frac_reward_zero_std"] = 1.0
            handle.write(json.dumps(record) + "\n")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, run)
        await wait_for(pilot, lambda: len(screen.view.alerts) > 0)
        kinds = {a.kind for a in screen.view.alerts}
        banner = plain(screen.query_one("#alert-banner"))
        assert any(kind in banner for kind in kinds)
        assert screen.query_one("#alerts-table").row_count == len(screen.view.alerts)
        assert "alert" in plain(screen.query_one("#run-title"))


async def test_escape_leaves_the_run_going_and_q_asks_about_live_runs(app_factory, live_run) -> None:
    run = live_run
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await open_dashboard(app, pilot, run)
        await pilot.press("escape")
        assert isinstance(app.screen, PresetScreen)
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("escape")  # cancel: still here
        assert isinstance(app.screen, PresetScreen) and app.is_running
        await pilot.press("q")
        await pilot.press("l")  # leave it running
        await wait_for_exit(app)
    assert not (run / "control.json").exists()


async def test_the_quit_question_goes_when_its_runs_end(app_factory, runs_dir, live_run) -> None:
    # Asked on the presets screen (no dashboard watching): the dialog asks run.json itself. One run ending
    # leaves the other in the question; the last ending quits, as the user had asked.
    other = make_run(runs_dir / "other", steps=3, finished=False).path
    mark_running(other)
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        for run in (live_run, other):
            await open_dashboard(app, pilot, run)
            await pilot.press("escape")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        assert "live, other" in plain(app.screen.query_one("#still-running"))

        def end(run: Path) -> None:
            meta = json.loads((run / "run.json").read_text())
            meta.update(status="finished", exit_code=0)
            (run / "run.json").write_text(json.dumps(meta))

        end(other)
        await wait_for(pilot, lambda: plain(app.screen.query_one("#still-running")) == "Still running: live")
        assert app.is_running
        end(live_run)
        await wait_for_exit(app)
    assert not (live_run / "control.json").exists()  # nothing was stopped


async def test_quit_can_stop_the_live_run(app_factory, live_run) -> None:
    run = live_run
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await open_dashboard(app, pilot, run)
        await pilot.press("q")
        await pilot.press("s")
        await wait_for_exit(app)
    assert json.loads((run / "control.json").read_text())["stop"] is True


async def test_finished_runs_refuse_toggle_and_stop(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await open_dashboard(app, pilot, recorded_run)
        await pilot.press("t")
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)
        assert not (recorded_run / "control.json").exists()
        await pilot.press("q")  # nothing live: quits at once
        await wait_for_exit(app)


async def test_app_reattaches_to_a_running_run_on_start(app_factory, runs_dir, recorded_run) -> None:
    run = make_run(runs_dir / "20260102-000000-tiny-cpu", steps=10, finished=False).path
    mark_running(run)
    app = app_factory(auto_attach=True, clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        assert app.screen.run_path == run


async def test_a_new_alert_on_a_live_run_is_flashed(app_factory, live_run) -> None:
    app = app_factory(clock=lambda: T0 + 12.0)  # just after the recorded steps: no stall
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_dashboard(app, pilot, live_run)
        assert not screen.view.alerts
        rng = random.Random(2)
        with open(live_run / "metrics.jsonl", "a") as handle:
            for step in range(11, 21):
                record = step_record(step, rng)
                record["frac_reward_zero_std"] = 1.0
                handle.write(json.dumps(record) + "\n")
        await wait_for(pilot, lambda: len(screen.view.alerts) > 0)
        await wait_for(pilot, lambda: any("at step" in str(n.title) for n in app._notifications))


async def test_q_does_not_ask_about_a_run_that_ended_after_its_dashboard_closed(app_factory, live_run) -> None:
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await open_dashboard(app, pilot, live_run)
        await pilot.press("escape")
        assert live_run in app.live_runs
        meta = json.loads((live_run / "run.json").read_text())
        (live_run / "run.json").write_text(json.dumps({**meta, "status": "finished"}))  # it ended meanwhile
        await pilot.press("q")
        await wait_for_exit(app)
