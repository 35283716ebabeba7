"""benchmarks/fsdp_rollouts.py on the CPU: one tiny run becomes a row of the committed file's schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

ROW_KEYS = {
    "label", "preset", "fsdp", "lora", "backend", "batch", "completion_length", "step_s", "generation_s",
    "generation_tokens_per_s", "bound_fraction", "peak_gib", "decode_copy_gib",
}  # fmt: skip


@pytest.mark.slow
def test_one_run_and_a_rollout_file_become_rows(tiny_model_path: Path, tmp_path: Path, capsys) -> None:
    bench = load_benchmark("fsdp_rollouts")
    rollout = tmp_path / "generation-bench.json"
    throughput = {"backend": "graph", "batch": 128, "s": 1.1, "tokens_per_s": 30000.0, "bound_tokens_per_s": 88000.0}
    throughput.update(bound_fraction=30000 / 88000, peak_mib=7467.0)
    rollout.write_text(
        json.dumps(
            {"model": "qwen3-0.6b-shape (bf16)", "device": "GPU-A", "new_tokens": 256, "throughput": [throughput]}
        )
    )
    argv = ["--data", "builtin:addition", "--preset", "tiny-cpu", "--model", "builtin:tiny-qwen3"]
    argv += ["--specs", "graph-lora-merged", "--steps", "2", "--batch", "16", "--length", "4", "--out", str(tmp_path)]
    assert bench.main([*argv, "--rollouts", str(rollout)]) == 0
    rows = json.loads((tmp_path / "fsdp-rollouts.json").read_text())["rows"]
    run, rolled = rows
    assert ROW_KEYS <= set(run) and ROW_KEYS <= set(rolled)
    assert run["label"] == "graph-lora-merged" and run["lora"] and not run["fsdp"]
    assert run["steps"] == [2] and run["step_s"] > 0 and run["batch"] == 16 and run["completion_length"] == 4
    assert run["backend"] == "generate"  # the CPU: graph needs CUDA
    assert rolled["bound_fraction"] == pytest.approx(0.3409, abs=1e-4) and rolled["peak_gib"] == 7.29
    assert "graph-lora-merged" in capsys.readouterr().out.splitlines()[-2]
    # An earlier call's rows come first; both commands are kept
    later = tmp_path / "later"
    assert (
        bench.main(
            [
                "--data",
                "builtin:addition",
                "--specs",
                "--out",
                str(later),
                "--rows-from",
                str(tmp_path / "fsdp-rollouts.json"),
                "--rollouts",
                str(rollout),
            ]
        )
        == 0
    )
    merged = json.loads((later / "fsdp-rollouts.json").read_text())
    assert [r["label"] for r in merged["rows"]] == ["graph-lora-merged", rolled["label"], rolled["label"]]
    assert len(merged["command"]) == 2 and "--rows-from" in merged["command"][1]
    # A merge alone names the devices of what it merged, not this machine's
    first = json.loads((tmp_path / "fsdp-rollouts.json").read_text())["device"]
    assert first != "GPU-A" and merged["device"] == f"{first} + GPU-A"
    with pytest.raises(SystemExit):
        bench.main([*argv[:-2], "--specs", "nope", "--out", str(tmp_path)])


@pytest.mark.slow
def test_a_profiled_step_is_left_out_and_its_tables_kept(tiny_model_path: Path, tmp_path: Path) -> None:
    bench = load_benchmark("fsdp_rollouts")
    argv = ["--data", "builtin:addition", "--preset", "tiny-cpu", "--model", "builtin:tiny-qwen3", "--batch", "16"]
    argv += ["--specs", "graph-lora-merged", "--steps", "3", "--length", "4", "--profile-step", "2"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "fsdp-rollouts.json").read_text())["rows"]
    assert row["steps"] == [3]  # step 1 compiles, step 2 ran under the profiler
    tables = (tmp_path / "graph-lora-merged-profile-step2.txt").read_text()
    assert "optimizer step 2" in tables and "aten::" in tables


@pytest.mark.parametrize(("step", "steps"), [("1", "3"), ("3", "3"), ("0", "4")])
def test_a_profiled_step_must_leave_a_step_to_report(step: str, steps: str, tmp_path: Path, capsys) -> None:
    bench = load_benchmark("fsdp_rollouts")
    argv = ["--data", "builtin:addition", "--specs", "graph-lora-merged", "--steps", steps, "--profile-step", step]
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"--profile-step: got {step}; allowed: a step from 2 to --steps - 1" in capsys.readouterr().err
    assert not (tmp_path / "fsdp-rollouts.json").exists()
