"""The final save: a run ends with RUN/model/, loadable in a fresh process, private, written whole or not at all."""

from __future__ import annotations

import errno
import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_trainer import make_run

from grpo_tui.runs.metrics import read_records
from grpo_tui.runs.model_dir import MODEL_INFO, read_info
from grpo_tui.runs.status import RunStatus, judge
from grpo_tui.train import entry, final_model

# Eight sums the tiny model is trained on the format of; greedy decoding makes the completions a fingerprint
PROMPTS = ["12+34=", "7+58=", "90+9=", "45+45=", "3+3=", "66+21=", "18+80=", "51+7="]
GREEDY = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer

def greedy(model, tokenizer, prompts):
    model.eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")
            new = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            out.append(tokenizer.decode(new[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return out

if __name__ == "__main__":
    path = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(path)
    print(json.dumps(greedy(model, AutoTokenizer.from_pretrained(path), json.loads(sys.argv[2]))))
"""


def _greedy_in_process(model: Any, tokenizer: Any) -> list[str]:
    namespace: dict[str, Any] = {}
    exec(GREEDY, namespace)
    return namespace["greedy"](model, tokenizer, PROMPTS)


@pytest.fixture(scope="module")
def trained(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 30-step tiny-cpu run, with the greedy completions of its model as training left it."""
    run = make_run(tmp_path_factory.mktemp("final"), "run", grpo={"max_steps": 30})
    seen: dict[str, Any] = {}
    real = final_model.save_final_model

    def save_and_remember(trainer: Any, target: Path, info: dict[str, Any]) -> Any:
        seen["greedy"] = _greedy_in_process(trainer.model, trainer.processing_class)
        return real(trainer, target, info)

    mp = pytest.MonkeyPatch()
    mp.setattr(final_model, "save_final_model", save_and_remember)
    try:
        code = entry.main(["--run-dir", str(run.path)])
    finally:
        mp.undo()
    return {"run": run, "code": code, "greedy": seen["greedy"]}


def test_the_model_loads_in_a_fresh_process_and_completes_as_trained(trained: dict[str, Any], tmp_path: Path) -> None:
    run = trained["run"]
    assert trained["code"] == 0
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    proc = subprocess.run(
        [sys.executable, str(script), str(run.model), json.dumps(PROMPTS)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == trained["greedy"]
    assert len(set(loaded)) > 1  # the prompts tell the completions apart: a fingerprint, not a constant


def test_finish_names_the_model_folder_and_its_size(trained: dict[str, Any]) -> None:
    run = trained["run"]
    finish = [r for r in read_records(run.metrics) if r.get("event") == "finish"]
    assert len(finish) == 1
    assert finish[0]["model"] == str(run.model)
    on_disk = sum(p.stat().st_size for p in run.model.rglob("*") if p.is_file())
    assert finish[0]["model_bytes"] == on_disk > 0
    info = read_info(run.model)
    assert info["kind"] == "full" and info["step"] == 30 and info["base_model"] == "builtin:tiny-qwen3"
    assert not [p for p in run.path.iterdir() if p.name.startswith(".model")]  # no temporary folder left


def test_model_folder_is_private(trained: dict[str, Any]) -> None:
    model = trained["run"].model
    assert stat.S_IMODE(model.stat().st_mode) == 0o700
    for path in model.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_checkpoints_of_a_stopped_run_are_private(tiny_model_path: Path, tmp_path: Path) -> None:
    from grpo_tui.runs.folder import write_json_atomic

    run = make_run(tmp_path, "stopped", grpo={"max_steps": 50})
    write_json_atomic(run.control, {"stop": True, "request_id": 1})
    assert entry.main(["--run-dir", str(run.path)]) == 0
    checkpoint = run.latest_checkpoint()
    assert checkpoint is not None and (run.model / MODEL_INFO).is_file()  # a stopped run saves its model too
    for path in [run.checkpoints, *run.checkpoints.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_a_failed_save_fails_the_run_with_one_line_and_leaves_no_folder(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import PreTrainedModel

    def disk_full(self: Any, folder: Any, **kwargs: Any) -> None:
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 100)  # half a file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(folder) / "model.safetensors"))

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_full)
    run = make_run(tmp_path, "full", grpo={"max_steps": 3})
    assert entry.main(["--run-dir", str(run.path)]) == entry.EXIT_ERROR
    assert not run.model.exists()
    assert not [p for p in run.path.iterdir() if p.name.startswith(".model")]
    verdict = judge(run.path)
    assert verdict.state is RunStatus.FAILED
    assert verdict.reason is not None and "\n" not in verdict.reason
    assert "final model" in verdict.reason and "No space left on device" in verdict.reason
    assert not [r for r in read_records(run.metrics) if r.get("event") == "finish"]
