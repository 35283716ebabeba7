"""Property-based fuzz of the inputs around a run's model: `export` and `eval` flags, hostile model folders,
`runs --delete/--prune`.

Whatever the input: no uncaught exception, a refusal is one line starting with the command's name, and a
failed export leaves nothing under the target name (no folder, no temporary folder beside it).
(`logging.save_total_limit` and the `[eval]` fields are preset fields: test_fuzz_inputs.py walks the
schema, so they are fuzzed there.)
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from grpo_tui.cli import main
from grpo_tui.config.store import BUILTIN_DIR

TINY_PRESET = BUILTIN_DIR / "tiny-cpu.toml"

# Cases per CI run: each export that gets as far as loading reads and writes the tiny model (~0.1 s).
ARGV_CASES = 80
FOLDER_CASES = 60
TIDY_CASES = 60
EVAL_CASES = 30
LINE_LIMIT = 700
SETTINGS = {"deadline": None, "database": None, "suppress_health_check": list(HealthCheck)}


@pytest.fixture(scope="module")
def root(tiny_model_path: Path) -> Iterator[Path]:
    """A finished run whose model/ is the tiny model (full weights), and one whose model/ is a LoRA adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_tui.train.final_model import write_model

    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory(prefix="fzm") as folder:
        patch.setenv("HF_HUB_OFFLINE", "1")  # a fuzzed base model name must not reach for the network
        base = Path(folder)
        for name, lora in (("full", False), ("lora", True)):
            run = base / name
            run.mkdir()
            (run / "metrics.jsonl").write_text("")
            model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
            if lora:
                model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
            info = {"step": 1, "base_path": str(tiny_model_path)}
            preset = tomllib.loads(TINY_PRESET.read_text())
            preset["eval"]["prompts"] = 4
            (run / "config.toml").write_text(tomli_w.dumps(preset))
            write_model(model, model.state_dict(), AutoTokenizer.from_pretrained(tiny_model_path), run / "model", info)
        yield base


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's refusal (its one line is on stderr)
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_refusal(code: int, err: str, prefix: str) -> None:
    assert code in (0, 1, 2), code
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    if code:
        assert len(lines) == 1, err[:2000]
        assert lines[0].startswith(prefix) and len(lines[0]) <= LINE_LIMIT, lines[0][:300]


def inside(folder: Path, text: str) -> Path:
    """`folder / text` with `text` kept inside `folder`: a leading slash dropped, and any path that would still
    leave it (through "..") not tried."""
    target = folder / text.lstrip("/")
    assume("\x00" in text or os.path.normpath(target).startswith(str(folder)))
    return target


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name] if parent.is_dir() else []


texts = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(categories=["Cc", "Cs"]), max_size=4),
    st.sampled_from(["", "-1", "1e3", "0x10", "9" * 40, "bf16", "fp8", "FP32", "..", "/", "\x00", "x" * 300]),
)


@settings(max_examples=ARGV_CASES, **SETTINGS)
@given(
    which=st.sampled_from(["full", "lora", "missing"]),
    to=texts,
    dtype=st.none() | st.sampled_from(["bf16", "fp16", "fp32"]) | texts,
    checkpoint=st.none() | texts,
    merged=st.booleans(),
    force=st.booleans(),
    extra=st.lists(texts, max_size=2),
)
def test_fuzz_export_flags(root: Path, which: str, to: str, dtype, checkpoint, merged, force, extra) -> None:
    with tempfile.TemporaryDirectory(dir=root) as folder:
        # Never outside the temporary folder: --force replaces what it is pointed at
        target = inside(Path(folder), to) if to else Path(to)
        argv = ["export", str(root / which), f"--to={target}", *extra]
        argv += [f"--dtype={dtype}"] if dtype is not None else []
        argv += [f"--checkpoint={checkpoint}"] if checkpoint is not None else []
        argv += ["--merged"] * merged + ["--force"] * force
        code, out, err = run_cli(argv)
        assert_one_line_refusal(code, err, "grpo-tui export")
        if code == 0:
            assert "wrote " in out and (
                (target / "config.json").is_file() or (target / "adapter_config.json").is_file()
            )
        assert not leftovers(Path(folder)), leftovers(Path(folder))


file_bytes = st.one_of(
    st.binary(max_size=48),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=6,
    ).map(lambda value: json.dumps(value).encode()),
)
MODEL_FILES = ["config.json", "adapter_config.json", "grpo-tui.json", "model.safetensors", "adapter_model.safetensors"]


@settings(max_examples=FOLDER_CASES, **SETTINGS)
@given(
    which=st.sampled_from(["full", "lora"]),
    files=st.dictionaries(st.sampled_from(MODEL_FILES), file_bytes | st.just(None), min_size=1, max_size=3),
    merged=st.booleans(),
)
def test_fuzz_hostile_model_folders_through_export(root: Path, which: str, files: dict, merged: bool) -> None:
    with tempfile.TemporaryDirectory(dir=root) as folder:
        run = Path(folder) / "run"
        shutil.copytree(root / which, run)
        for name, raw in files.items():
            path = run / "model" / name
            if raw is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(raw)
        target = Path(folder) / "out"
        code, _, err = run_cli(["export", str(run), "--to", str(target), *(["--merged"] if merged else [])])
        assert_one_line_refusal(code, err, "grpo-tui export")
        assert code == 0 or not target.exists()
        assert not leftovers(Path(folder))


@settings(max_examples=TIDY_CASES, **SETTINGS)
@given(flag=st.sampled_from(["--delete", "--prune"]), path=texts, yes=st.booleans(), files=st.booleans())
def test_fuzz_runs_delete_and_prune(root: Path, flag: str, path: str, yes: bool, files: bool) -> None:
    with tempfile.TemporaryDirectory(dir=root) as folder:
        # Never outside the temporary folder: these commands delete what they are pointed at
        target = inside(Path(folder), path)
        if files and path and "\x00" not in path:
            try:
                target.mkdir(parents=True, exist_ok=True)
                (target / "run.json").write_bytes(path.encode("utf-8", "surrogatepass"))
            except (OSError, UnicodeError):  # a name this file system refuses: the command gets it anyway
                pass
        code, _, err = run_cli(["runs", f"{flag}={target}", *(["--yes"] if yes else [])])
        assert_one_line_refusal(code, err, "grpo-tui runs")


@settings(max_examples=EVAL_CASES, **SETTINGS)
@given(
    which=st.sampled_from(["full", "lora", "missing"]),
    prompts=st.none() | st.integers(-3, 6).map(str) | texts,
    mode=st.none() | st.sampled_from(["greedy", "sampled"]) | texts,
    device=st.none() | st.sampled_from(["cpu", "auto"]) | texts,
)
def test_fuzz_eval_flags(root: Path, which: str, prompts, mode, device) -> None:
    argv = ["eval", str(root / which)]
    argv += [f"--prompts={prompts}"] if prompts is not None else []
    argv += [f"--mode={mode}"] if mode is not None else []
    argv += [f"--device={device}"] if device is not None else []
    code, out, err = run_cli(argv)
    assert_one_line_refusal(code, err, "grpo-tui eval")
    if code == 0:
        assert "→" in out and (root / which / "eval.json").is_file()
