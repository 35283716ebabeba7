"""Property-based fuzz of the files and values a preset points at: a local data file's bytes.

Whatever a data file holds (random bytes, random JSON lines, a bad line among good ones), `presets
validate` raises nothing and a refusal is one short line per problem that names the preset file.
"""

from __future__ import annotations

import io
import json
import re
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_tui.cli import main
from grpo_tui.config.store import BUILTIN_DIR
from grpo_tui.userinput import clip

# Cases per CI run (in-process `main`, a few ms each).
DATA_CASES = 300
LINE_LIMIT = 700
TINY = tomllib.loads((BUILTIN_DIR / "tiny-cpu.toml").read_text(encoding="utf-8"))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
rows = st.dictionaries(st.sampled_from(["question", "answer", "q", ""]), json_values, max_size=3)
json_lines = st.lists(st.one_of(rows.map(json.dumps), json_values.map(json.dumps), st.text(max_size=30)), max_size=8)
data_bytes = st.one_of(
    json_lines.map(lambda lines: "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")),
    st.binary(max_size=200),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-data")


@settings(max_examples=DATA_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(content=data_bytes, suffix=st.sampled_from([".jsonl", ".json"]))
def test_fuzz_data_files_through_validate(folder: Path, content: bytes, suffix: str) -> None:
    data = folder / f"train{suffix}"
    data.write_bytes(content)
    preset = {**TINY, "name": "fuzz", "data": {**TINY["data"], "source": data.name}}
    path = folder / "fuzz.toml"
    path.write_text(tomli_w.dumps(preset), encoding="utf-8")
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["presets", "validate", str(path)])
    lines = err.getvalue().splitlines()
    assert code in (0, 2), err.getvalue()
    assert all(line.startswith(f"{clip(str(path))}: ") and len(line) <= LINE_LIMIT for line in lines), lines
    assert (code == 2) == any(": warning" not in line for line in lines)


REWARD_CASES = 200
REWARD_MODULE = "fuzz_reward_answers"
reward_answers = st.one_of(
    json_values,
    st.lists(st.one_of(st.floats(), st.integers(), st.none(), st.text(max_size=4), st.booleans()), max_size=4),
    st.tuples(st.floats(), st.floats()),
)


@pytest.fixture(scope="module")
def reward_module(tmp_path_factory: pytest.TempPathFactory):
    import importlib
    import sys

    folder = tmp_path_factory.mktemp("fuzz-reward")
    (folder / f"{REWARD_MODULE}.py").write_text("ANSWER = None\n\ndef reward(**kwargs):\n    return ANSWER\n")
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(REWARD_MODULE)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(REWARD_MODULE, None)


@settings(max_examples=REWARD_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(answer=reward_answers)
def test_fuzz_reward_answers_through_show(reward_module, answer) -> None:
    reward_module.ANSWER = answer
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = main(["presets", "show", "tiny-cpu", "--set", f"rewards.functions=[{{name='{REWARD_MODULE}:reward'}}]"])
    errors = [line for line in out.getvalue().splitlines() if line.startswith("# error: ")]
    fits = isinstance(answer, (list, tuple)) and len(answer) == 2
    fits = fits and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in answer)
    assert code == (0 if fits else 2), errors
    assert all(len(line) <= LINE_LIMIT and "rewards.functions.0.name" in line for line in errors), errors


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(name=st.from_regex(r"[A-Za-z0-9][\w.-]{0,20}/[\w.-]{1,20}", fullmatch=True) | st.text(max_size=40))
@example(name="\n")
@example(name="org/na\rme\x00")
@example(name="~0")  # `~user` of no user: pathlib raises instead of expanding
def test_fuzz_model_ids_through_the_hub_check(name: str) -> None:
    from grpo_tui.config.hub_check import hub_model_problem

    problem = hub_model_problem(name, True)  # HF_HUB_OFFLINE (conftest): decided without the network
    assert problem is None or (problem.startswith("model.name_or_path: ") and len(problem.splitlines()) == 1), problem


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    beta=st.floats(allow_nan=False, allow_infinity=False) | st.integers(min_value=-(2**80), max_value=2**80),
    alpha=st.floats(allow_nan=False, allow_infinity=False) | st.integers(min_value=-(2**80), max_value=2**80),
    blank=st.text(alphabet=" \t", max_size=5),
)
def test_fuzz_bounds_and_blanks(beta, alpha, blank: str) -> None:
    from pydantic import ValidationError

    from grpo_tui.config.schema import Preset

    for section, key, value, ok in (
        ("grpo", "beta", beta, 0 <= beta <= 100),
        ("peft", "alpha", alpha, 0 < alpha <= 65536),
        ("model", "name_or_path", blank, False),
        ("distributed", "fsdp_version", bool(len(blank) % 2), False),
    ):
        try:
            Preset.model_validate({section: {key: value}})
            accepted = True
        except ValidationError:
            accepted = False
        assert accepted == ok, (section, key, value)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(old=st.text(max_size=70), new=st.text(max_size=70), command=st.sampled_from(["rename", "delete", "save"]))
def test_fuzz_preset_names_through_rename_delete_save(tmp_path_factory, old: str, new: str, command: str) -> None:
    import os

    folder = tmp_path_factory.mktemp("fuzz-names")
    os.environ["GRPO_TUI_PRESETS_DIR"] = str(folder)
    try:
        argv = {
            "rename": ["presets", "rename", "--", old, new],
            "delete": ["presets", "delete", "--yes", "--", old],
            "save": ["presets", "save", "--", new],
        }[command]
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            code = main(argv)
    finally:
        del os.environ["GRPO_TUI_PRESETS_DIR"]
    lines = err.getvalue().splitlines()
    assert code in (0, 2), err.getvalue()
    assert code == 0 or (len(lines) >= 1 and all(len(line) <= LINE_LIMIT for line in lines)), lines
    assert all(path.parent == folder for path in folder.rglob("*.toml"))  # nothing written outside the folder


LENGTH_VALUES = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"(realistic|cap)(:[0-9٣\- ]{0,22})?\s?", fullmatch=True),
)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=LENGTH_VALUES)
@example(raw="realistic:" + "9" * 30)
@example(raw="cap\n")
def test_fuzz_completion_lengths_variable_through_the_run_checks(raw: str) -> None:
    from grpo_tui.config.checks import environment_errors
    from grpo_tui.config.store import load_preset
    from grpo_tui.tasks.workload import LENGTHS_ENV, ForcedLengths

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(LENGTHS_ENV, raw)
            errors = environment_errors(load_preset("tiny-cpu")[0])
    except (ValueError, UnicodeEncodeError):  # not a value an environment can hold (a NUL, a lone surrogate)
        return
    accepted = raw in ("", "cap") or re.fullmatch(r"realistic(:[0-9]{1,19})?", raw, re.ASCII) is not None
    assert errors == [] if accepted else len(errors) == 1, errors
    for line in errors:
        assert line.startswith(f"{LENGTHS_ENV}: got ") and len(line.splitlines()) == 1 and len(line) <= LINE_LIMIT
        assert line.endswith("allowed: cap, realistic or realistic:SEED (SEED a whole number of up to 19 digits)")
    if accepted and raw.startswith("realistic"):
        forced = ForcedLengths(int(raw.partition(":")[2] or 0))
        assert forced.draw(4, 8, 0, 0, 0) == forced.draw(4, 8, 0, 0, 0)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=LENGTH_VALUES, tool=st.sampled_from(["tune", "max-batch", "bench memory"]))
def test_fuzz_lengths_flag_of_the_tools(raw: str, tool: str) -> None:
    """Parsed only (a trial is a training run): accepted, or argparse's one error line."""
    from grpo_tui.tools import bench_memory, tune

    parsers = {
        "tune": tune.build_parser,
        "max-batch": lambda: bench_memory.common_parser("grpo-tui max-batch", ""),
        "bench memory": lambda: bench_memory.common_parser("grpo-tui bench memory", ""),
    }
    argv = ["tiny-cpu", f"--lengths={raw}", *(["--memory-cap", "8"] if tool == "tune" else [])]
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            args = parsers[tool]().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2
        lines = [line for line in err.getvalue().splitlines() if f"grpo-tui {tool}: error:" in line]
        assert len(lines) == 1 and "argument --lengths: got " in lines[0] and len(lines[0]) <= LINE_LIMIT, (
            err.getvalue()
        )
        return
    assert args.lengths == raw and (raw == "cap" or raw.startswith("realistic"))
