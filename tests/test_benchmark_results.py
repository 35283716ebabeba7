"""The canonical benchmark results: one folder per benchmark, each `result.json` parses, names the script and the
exact command that produced it, and docs/benchmarks.md is what `benchmarks/results_doc.py` makes of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark  # tests/ is on sys.path (its conftest.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def results_doc():
    return load_benchmark("results_doc")


def test_results_stay_few_and_in_one_folder_per_benchmark() -> None:
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(files) <= 60, f"{len(files)} files under benchmarks/results/ (keep the latest result per benchmark)"
    loose = [p.name for p in RESULTS.iterdir() if p.is_file()]
    assert loose == [], f"files outside a benchmark's folder: {loose}"
    nested = [str(p.relative_to(RESULTS)) for p in RESULTS.glob("*/*") if p.is_dir()]
    assert nested == [], f"folders inside a benchmark's folder: {nested}"


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_each_result_parses_and_names_its_command(results_doc, folder: Path) -> None:
    result = results_doc.load_result(folder)
    assert (ROOT / result["script"]).is_file(), f"{result['script']} does not exist"
    assert Path(result["script"]).name.split(".")[0] in result["command"] or "gpu_e2e.sh" in result["command"]
    for name in result.get("raw", []):
        assert (folder / name).is_file(), f"{folder.name}: raw file {name} is missing"
    listed = {"result.json", *result.get("raw", [])}
    unlisted = sorted(p.name for p in folder.iterdir() if p.name not in listed)
    assert unlisted == [], f"{folder.name}: files the result does not list: {unlisted}"


def test_a_malformed_result_is_one_line_naming_the_file(results_doc, tmp_path: Path) -> None:
    folder = tmp_path / "some-bench"
    folder.mkdir()
    (folder / "result.json").write_text(json.dumps({"benchmark": "some-bench", "title": "t"}))
    with pytest.raises(results_doc.ResultError, match=r"result.json: missing script, command"):
        results_doc.load_result(folder)
    (folder / "result.json").write_text("{not json")
    with pytest.raises(results_doc.ResultError, match="unreadable"):
        results_doc.load_result(folder)


def test_docs_benchmarks_md_is_current(results_doc) -> None:
    expected = results_doc.render(results_doc.load_results())
    assert (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8") == expected, (
        "docs/benchmarks.md is out of date: run python benchmarks/results_doc.py"
    )
    assert results_doc.main(["--check"]) == 0


ENTRY_POINTS = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "benchmarks").rglob("*.py")
    if "results" not in p.parts and 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
)


@pytest.mark.slow
@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_each_benchmark_script_documents_itself_with_help(script: str) -> None:
    """Every script under benchmarks/ is an entry point that explains itself (from a checkout, installed or not)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_the_benchmark_scripts_are_all_entry_points() -> None:
    library = {
        "bench_providers.py",
        "timing.py",
        "bench_padded.py",
        "sampling_check.py",
        "step_times.py",
    }
    scripts = {Path(s).name for s in ENTRY_POINTS}
    stray = sorted(p.name for p in (ROOT / "benchmarks").rglob("*.py") if p.name not in scripts | library)
    assert stray == [], f"benchmark modules that are neither an entry point nor a module the scripts share: {stray}"


def test_a_result_of_several_calls_lists_each_command_on_its_own_line(results_doc) -> None:
    result = {
        "benchmark": "b",
        "script": "benchmarks/x.py",
        "title": "t",
        "summary": "s",
        "command": "call one --a\ncall two --b",
        "commit": "c",
        "device": "d",
        "date": "2026-01-01",
        "tables": [],
    }
    text = results_doc.render([result])
    assert "  ```bash\n  call one --a\n  call two --b\n  ```" in text
    assert "command: `call one" not in text
    single = results_doc.render([{**result, "command": "call one --a"}])
    assert "- script: `benchmarks/x.py`; command: `call one --a`" in single
