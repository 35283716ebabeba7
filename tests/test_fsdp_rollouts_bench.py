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
