"""CompletionIndex: incremental indexing of completions.jsonl, grouping by prompt, history kept."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_tui.runs.completions import CompletionIndex
from grpo_tui.tools.demo import make_run


def _row(step: int, prompt: object, text: str, adv: float | None = 0.5, **rewards: float) -> str:
    return json.dumps({"step": step, "prompt": prompt, "completion": text, "rewards": rewards, "advantage": adv}) + "\n"


def test_recorded_run_groups_by_prompt(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=40)
    index = CompletionIndex(run.path / "completions.jsonl")
    assert index.poll()
    assert index.steps == tuple(range(1, 41)) and len(index) == 40 and index.complete
    rows = [json.loads(line) for line in (run.path / "completions.jsonl").read_text().splitlines()]
    step7 = [r for r in rows if r["step"] == 7]
    groups = index.groups(7)
    assert [g.prompt for g in groups] == list(dict.fromkeys(r["prompt"] for r in step7))
    assert sum(len(g.completions) for g in groups) == len(step7) == index.count(7)
    first = groups[0].completions[0]
    assert (first.text, first.rewards, first.advantage) == (
        step7[0]["completion"],
        step7[0]["rewards"],
        step7[0]["advantage"],
    )
    assert first.total_reward == sum(step7[0]["rewards"].values())
    assert groups[0].mean_reward == sum(c.total_reward for c in groups[0].completions) / len(groups[0].completions)
    assert index.groups(999) == []


def test_incremental_poll_partial_lines_and_history(tmp_path: Path) -> None:
    path = tmp_path / "completions.jsonl"
    index = CompletionIndex(path)
    assert not index.poll()  # no file yet
    path.write_text(_row(1, "2+2=", "4", acc=1.0) + _row(1, "2+2=", "5", acc=0.0))
    assert index.poll() and index.steps == (1,)
    partial = _row(2, "3+3=", "6", acc=1.0)
    with open(path, "a") as handle:
        handle.write(partial[:20])  # the trainer is mid-line
    assert not index.poll() and index.steps == (1,)
    assert [c.text for c in index.groups(1)[0].completions] == ["4", "5"]
    with open(path, "a") as handle:
        handle.write(partial[20:] + _row(1, "9+9=", "18", acc=1.0))  # a late line for step 1
    assert index.poll()
    assert index.steps == (1, 2)  # step 1 is kept, not overwritten
    assert [g.prompt for g in index.groups(1)] == ["2+2=", "9+9="]  # the cached step 1 was refreshed
    assert index.groups(2)[0].completions[0].rewards == {"acc": 1.0}


def test_malformed_lines_chat_prompts_and_missing_fields(tmp_path: Path) -> None:
    path = tmp_path / "completions.jsonl"
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}]
    path.write_text(
        "not json at all\n"
        + _row(3, chat, "2", adv=None, acc=1.0)
        + '{"step": 3, "prompt": "x", "completion": "torn\n'
        + json.dumps(
            {"step": 4, "prompt": "q", "completion": 'text mentioning "step": 99', "rewards": {"acc": "bad", "fmt": 1}}
        )
        + "\n"
    )
    index = CompletionIndex(path)
    index.poll()
    assert index.steps == (3, 4)  # the quoted "step": 99 inside a string is not a step
    (group,) = index.groups(3)
    assert group.prompt == "system: be brief\nuser: 1+1?"
    assert group.completions[0].advantage is None
    (other,) = index.groups(4)
    assert other.completions[0].rewards == {"fmt": 1.0} and other.completions[0].advantage is None


def test_large_file_is_indexed_newest_first_within_a_budget(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=60)
    path = run.path / "completions.jsonl"
    whole = CompletionIndex(path)
    whole.poll()
    budgeted = CompletionIndex(path, budget_bytes=3000)  # a few steps' worth per poll
    budgeted.poll()
    first = budgeted.steps
    assert first and first[-1] == 60 and first[0] > 1 and not budgeted.complete  # the newest steps first
    with open(path, "a") as handle:  # the run goes on while the history is indexed
        handle.write(_row(61, "1+1=", "2", acc=1.0))
    polls = 1
    while not budgeted.complete:
        budgeted.poll()
        polls += 1
    budgeted.poll()
    assert polls > 3
    assert budgeted.steps == tuple(range(1, 62))
    for step in (1, 17, first[0], 60):  # first[0] may have been split across two polls
        assert budgeted.records(step) == whole.records(step)
    assert [g.prompt for g in budgeted.groups(61)] == ["1+1="]


def test_a_line_longer_than_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "completions.jsonl"
    path.write_text(_row(1, "p", "x" * 5000, acc=1.0) + _row(2, "p", "y" * 5000, acc=0.0) + _row(3, "p", "z", acc=0.0))
    index = CompletionIndex(path, budget_bytes=1000)
    for _ in range(10):
        index.poll()
    assert index.complete and index.steps == (1, 2, 3)
    assert index.groups(2)[0].completions[0].text == "y" * 5000
