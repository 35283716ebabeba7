"""Property-based fuzz of the two ways users hand us input: preset files and `--set` values.

Mutations of the built-in presets (random values of random types at random dotted paths, random
bytes, deep nesting, huge integers, lone surrogates, byte order marks) go through `presets validate`;
random `--set` items through `presets show`. The CLI's `main()` runs in-process (a subprocess per case
would take minutes). Whatever the input: no uncaught exception, and a refusal is one short stderr line
per problem, starting with where the problem is (the file, or `--set`).
"""

from __future__ import annotations

import copy
import io
import json
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tui.cli import main
from grpo_tui.config import checks
from grpo_tui.config.schema import walk_fields
from grpo_tui.config.store import BUILTIN_DIR
from grpo_tui.userinput import clip

# Cases per CI run: 700 files + 500 --set items (about 20 s on 2 cores).
FILE_CASES = 700
SET_CASES = 500
# An error line: source, dotted path, a value cut to 80 characters, what is allowed (the longest
# lists every key of [grpo]).
LINE_LIMIT = 700
BUILTINS = {p.stem: tomllib.loads(p.read_text(encoding="utf-8")) for p in sorted(BUILTIN_DIR.glob("*.toml"))}
DOTTED = sorted(f.path for f in walk_fields()) + ["rewards.functions.0.name", "rewards.functions.0.weight"]
FILE_NAMES = ("p.toml", "my preset.toml", "ünï cödé.toml", "x" * 200 + ".toml")
BOM = b"\xef\xbb\xbf"
# Values the hostile tester found trouble with, mixed into the random ones.
NASTY: list[Any] = [
    "",
    "x" * 100_000,
    "a\u0085b",
    "{",
    "{nope}",
    "{question:>1000000000000000000000}",
    "{question.__class__}",
    "builtin:nope",
    "../" * 100,
    "./" + "m" * 300,
    "os.path:basename",
    "\x00",
    10**18,
    -(2**63),
    2**32,
    10**300,
    float("nan"),
    float("inf"),
    -0.0,
    1e308,
    True,
    [],
    {},
]
NASTY_SET_TEXT = ["9" * 4301, "[" * 1000 + "]" * 1000, "{" * 300, '"' + "x" * 100_000 + '"', "1e400", "nan", "-inf"]

scalars = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(),
    st.booleans(),
    st.text(max_size=30),
    st.text(st.characters(categories=["Cc", "Cs", "Zl", "Cf"]), max_size=5),  # control chars, lone surrogates
    st.sampled_from(NASTY),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module", autouse=True)
def _isolated() -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory(prefix="fz") as folder:
        patch.setenv("GRPO_TUI_PRESETS_DIR", str(Path(folder) / "user"))
        patch.setattr(checks, "visible_gpu_count", lambda: 8)  # NVML per case would dominate the time
        yield Path(folder)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`grpo-tui ARGV` in-process: (exit code, stdout, stderr). An uncaught exception fails the case."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_refusal_lines(code: int, out: str, err: str, source: str) -> None:
    assert code in (0, 1, 2), code
    assert "Traceback" not in err
    lines = err.splitlines()
    if code:
        # `presets show` prints a valid preset's failed checks as `# error:` comments under it.
        assert lines or "\n# error: " in out, "a refusal says why"
    for line in lines:
        assert line.startswith(source), line[:300]
        assert len(line) <= LINE_LIMIT, line[:300]


def assign(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` in `data`, making tables (or list items) on the way."""
    node: Any = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if isinstance(node, list) and part.isdigit():
            while len(node) <= int(part):
                node.append({})
            if not isinstance(node[int(part)], dict):
                node[int(part)] = {}
            node = node[int(part)]
        elif isinstance(node, dict):
            if not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]
        else:
            return
    if isinstance(node, dict):
        node[parts[-1]] = value


@st.composite
def preset_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, bytes): a built-in preset, mutated."""
    data = copy.deepcopy(BUILTINS[draw(st.sampled_from(sorted(BUILTINS)))])
    if draw(st.booleans()):
        data.pop("name", None)  # named after the file then
    for _ in range(draw(st.integers(0, 3))):
        dotted = draw(st.sampled_from(DOTTED) | st.text(min_size=1, max_size=12))
        assign(data, dotted, draw(values))
    try:
        raw = tomli_w.dumps(data).encode("utf-8", "surrogatepass")  # a lone surrogate: bytes that are not UTF-8
    except (TypeError, ValueError):  # tomli_w cannot write every mixture
        raw = b"name = 1\n"
    kind = draw(st.sampled_from(["plain"] * 5 + ["bom", "bytes", "truncate", "deep", "huge int"]))
    if kind == "bom":
        raw = BOM + raw
    elif kind == "bytes":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    elif kind == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif kind == "deep":
        depth = draw(st.sampled_from([30, 500, 1000, 5000]))
        raw = b"deep = " + b"[" * depth + b"]" * depth + b"\n" + raw
    elif kind == "huge int":
        raw = b"huge = " + b"7" * draw(st.sampled_from([4300, 4301, 10_000])) + b"\n" + raw
    return draw(st.sampled_from(FILE_NAMES)), raw


@settings(max_examples=FILE_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=preset_files())
def test_fuzz_preset_files_through_validate(_isolated: Path, case: tuple[str, bytes]) -> None:
    name, raw = case
    path = _isolated / name
    path.write_bytes(raw)
    code, out, err = run_cli(["presets", "validate", str(path)])
    assert_refusal_lines(code, out, err, clip(str(path)))
    if raw.startswith(BOM):  # a byte order mark changes nothing
        path.write_bytes(raw[len(BOM) :])
        assert run_cli(["presets", "validate", str(path)])[0] == code


def set_text(value: Any) -> str:
    """`value` as TOML value syntax, as a user would type it after `key=`."""
    try:
        return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()
    except (TypeError, ValueError, IndexError):
        return str(value)


set_values = st.one_of(
    values.map(set_text),
    st.text(max_size=40),
    st.text(st.characters(categories=["Cs", "Cc"]), max_size=5),  # undecodable argv bytes arrive as surrogates
    st.sampled_from(NASTY_SET_TEXT),
)


@settings(max_examples=SET_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(DOTTED) | st.text(max_size=16), value=set_values)
def test_fuzz_set_values_through_show(key: str, value: str) -> None:
    code, out, err = run_cli(["presets", "show", "tiny-cpu", f"--set={key}={value}"])  # = form: "-x" is no option
    assert_refusal_lines(code, out, err, "--set: ")


# Cases of hostile run folders handed to `grpo-tui resume` (a few seconds).
RESUME_CASES = 150
run_files = st.one_of(
    values.map(lambda v: set_text(v).encode("utf-8", "surrogatepass")),
    st.binary(max_size=64),
    st.fixed_dictionaries({"argv": st.lists(st.text(max_size=8), max_size=3)}).map(lambda d: set_text(d).encode()),
)


@settings(max_examples=RESUME_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    files=st.dictionaries(st.sampled_from(["run.json", "command.json", "control.json", "metrics.jsonl"]), run_files),
    checkpoint=st.booleans(),
)
def test_fuzz_run_folders_through_resume(_isolated: Path, files: dict[str, bytes], checkpoint: bool) -> None:
    from grpo_tui.launch import resume

    with tempfile.TemporaryDirectory(dir=_isolated) as folder, pytest.MonkeyPatch.context() as patch:
        patch.setattr(resume, "run_foreground", lambda *a, **k: 0)  # never start a trainer
        for name, raw in files.items():
            (Path(folder) / name).write_bytes(raw)
        if checkpoint:
            (Path(folder) / "checkpoints" / "checkpoint-3").mkdir(parents=True)
            (Path(folder) / "checkpoints" / "checkpoint-3" / "trainer_state.json").write_text("{}")
        code, out, err = run_cli(["resume", folder])
        assert_refusal_lines(code, out, err, clip(folder))
        if code == 0:
            assert "--resume" in json.loads((Path(folder) / "command.json").read_text())["argv"]
