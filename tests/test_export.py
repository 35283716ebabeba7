"""`grpo-tui export`: LoRA merged equals the adapter model, full weights cast, refusals in one line, nothing half-written."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch
from test_trainer import make_run

from grpo_tui import cli
from grpo_tui.runs.model_dir import read_info
from grpo_tui.train import entry

LORA = {"enabled": True, "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}
IDS = torch.tensor([[5, 17, 40, 11, 23, 8, 30], [9, 9, 12, 50, 3, 44, 6]])


@pytest.fixture(scope="module")
def lora_run(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A large learning rate: the adapter must move the logits well away from the base's for the check to mean anything
    run = make_run(tmp_path_factory.mktemp("lora"), "run", grpo={"max_steps": 4, "learning_rate": 5e-2}, peft=LORA)
    assert entry.main(["--run-dir", str(run.path)]) == 0
    return run.path


@pytest.fixture(scope="module")
def full_run(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = make_run(tmp_path_factory.mktemp("full"), "run", grpo={"max_steps": 2}, logging={"save_steps": 1})
    assert entry.main(["--run-dir", str(run.path)]) == 0
    return run.path


def _logits(model: Any) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def test_merged_lora_gives_the_adapter_models_logits(lora_run: Path, tmp_path: Path, capsys) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    assert (lora_run / "model" / "adapter_config.json").is_file() and read_info(lora_run / "model")["kind"] == "lora"
    out = tmp_path / "merged"
    assert cli.main(["export", str(lora_run), "--to", str(out), "--merged", "--dtype", "fp32"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "model.safetensors" in printed and "AutoModelForCausalLM" in printed
    assert not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)  # transformers alone
    adapter = AutoPeftModelForCausalLM.from_pretrained(lora_run / "model", dtype=torch.float32)
    expected = _logits(adapter)
    with adapter.disable_adapter():
        base = _logits(adapter)
    assert (expected - base).abs().max() > 1e-3  # the adapter changed the model
    assert (_logits(merged) - expected).abs().max() <= 1e-5
    assert read_info(out)["merged"] is True and merged.dtype == torch.float32


def test_unmerged_lora_export_is_the_adapter(lora_run: Path, tmp_path: Path) -> None:
    from peft import AutoPeftModelForCausalLM

    out = tmp_path / "adapter"
    assert cli.main(["export", str(lora_run), "--to", str(out)]) == 0
    assert (out / "adapter_config.json").is_file() and read_info(out)["kind"] == "lora"
    a = AutoPeftModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    b = AutoPeftModelForCausalLM.from_pretrained(lora_run / "model", dtype=torch.float32)
    assert torch.equal(_logits(a), _logits(b))


def test_full_export_casts_and_exports_a_checkpoint(full_run: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "bf16"
    assert cli.main(["export", str(full_run), "--to", str(out), "--dtype", "bf16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    original = AutoModelForCausalLM.from_pretrained(full_run / "model")
    for (name, a), (_, b) in zip(model.state_dict().items(), original.state_dict().items(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16)), name
    step1 = tmp_path / "step1"
    assert cli.main(["export", str(full_run), "--to", str(step1), "--checkpoint", "1"]) == 0
    first = AutoModelForCausalLM.from_pretrained(step1).state_dict()
    assert any(not torch.equal(first[k], v) for k, v in original.state_dict().items())  # an earlier step's weights


def test_refusals_are_one_line_and_leave_nothing(full_run: Path, tmp_path: Path, capsys) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    cases = [
        ([str(tmp_path / "nowhere"), "--to", str(tmp_path / "a")], "not a run folder"),
        ([str(full_run), "--to", str(busy)], "not empty"),
        ([str(full_run), "--to", str(busy), "--force"], "not a model folder"),
        ([str(full_run), "--to", str(tmp_path / "b"), "--checkpoint", "9"], "no such checkpoint; saved steps: 1, 2"),
        ([str(full_run), "--to", str(full_run / "model" / "inner")], "exported from"),
    ]
    for argv, message in cases:
        assert cli.main(["export", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert (busy / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_force_replaces_an_earlier_export(full_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli.main(["export", str(full_run), "--to", str(out)]) == 0
    assert cli.main(["export", str(full_run), "--to", str(out), "--dtype", "fp16", "--force"]) == 0
    assert read_info(out)["dtype"] == "float16"


def test_a_corrupt_adapter_is_refused(lora_run: Path, tmp_path: Path, capsys) -> None:
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(lora_run, run)
    weights = run / "model" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    for extra in ([], ["--merged"]):
        assert cli.main(["export", str(run), "--to", str(tmp_path / "x"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "cannot load" in err and len(err.splitlines()) == 1
        assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.tmp-*"))


def test_a_full_disk_during_export_leaves_nothing(full_run: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    from transformers import PreTrainedModel

    def disk_full(self: Any, folder: Any, **kwargs: Any) -> None:
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 10)
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_full)
    assert cli.main(["export", str(full_run), "--to", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_export_bench_smoke_mode_writes_time_and_size_per_variant(tiny_model_path: Path, tmp_path: Path) -> None:
    from benchmark_scripts import load_benchmark

    out = tmp_path / "export.json"
    assert load_benchmark("export_bench").main(["--tiny", "--repeats", "1", "--out", str(out)]) == 0
    result = __import__("json").loads(out.read_text())
    adapter, merged = result["variants"]["adapter"], result["variants"]["merged"]
    assert adapter["seconds"] > 0 and merged["seconds"] > 0
    # The merged folder holds the whole model; the adapter folder only the small LoRA matrices
    assert merged["bytes"] > adapter["bytes"] > 0
    assert "--tiny" in result["command"]


def test_the_apps_export_runs_the_command_in_a_child_process(full_run: Path, tmp_path: Path) -> None:
    from grpo_tui.launch.export import ExportOptions, run_export

    done = run_export(full_run, ExportOptions(to=tmp_path / "app", dtype="fp16"))
    assert done.ok and done.line.startswith(f"wrote {tmp_path / 'app'}")
    assert read_info(tmp_path / "app")["dtype"] == "float16"
    refused = run_export(full_run, ExportOptions(to=tmp_path / "app"))  # not empty now, no force
    assert not refused.ok and "not empty" in refused.line
