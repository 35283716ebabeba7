"""FSDP2 on two CPU processes: the final save gathers the full weights once on rank 0, and the exported model
equals both the shards concatenated and a one-process twin trained on the same data.

accelerate's --use_fsdp on the CPU falls back to DDP, so the script shards with `fully_shard` itself and calls
the trainer's own save path (`full_state_dict` + `write_model`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_tui import cli

pytestmark = pytest.mark.slow

SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer
from grpo_tui.train.final_model import full_state_dict, write_model

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
path, out = sys.argv[1], Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(path).float()
twin = AutoModelForCausalLM.from_pretrained(path).float()  # unsharded, the one-process run
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
# SGD: the update is the gradient itself, so the comparison measures the gather, not Adam's sign-like step
opt, twin_opt = torch.optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(twin.parameters(), lr=0.5)
for step in range(2):
    ids = torch.randint(3, 60, (4, 10), generator=torch.Generator().manual_seed(100 * step + rank))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step(); opt.zero_grad()
    twin(input_ids=ids, labels=ids).loss.backward()
    for p in twin.parameters():  # both ranks' batches averaged, as FSDP reduces the gradients
        dist.all_reduce(p.grad); p.grad /= world
    twin_opt.step(); twin_opt.zero_grad()
state = full_state_dict(model)
torch.save({n: p.to_local().detach().clone() for n, p in model.named_parameters()}, out / f"shards{rank}.pt")
if rank == 0:
    assert all(not hasattr(t, "full_tensor") for t in state.values())
    write_model(model, state, AutoTokenizer.from_pretrained(path), out / "run" / "model", {"step": 2})
    torch.save(twin.state_dict(), out / "twin.pt")
else:
    assert state == {}  # gathered once, on rank 0 only
dist.barrier()
os._exit(0)
"""


def test_fsdp2_export_equals_the_shards_and_a_one_process_twin(tiny_model_path: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    script = tmp_path / "fsdp_save.py"
    script.write_text(SCRIPT)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*argv, str(script), str(tiny_model_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "exported"
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    shards = [torch.load(tmp_path / f"shards{r}.pt") for r in (0, 1)]
    twin = torch.load(tmp_path / "twin.pt")
    original = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    for name, local in shards[0].items():
        assert local.shape[0] < exported[name].shape[0] or exported[name].shape[0] == 1, name  # really sharded
        assert torch.equal(torch.cat([local, shards[1][name]]), exported[name]), name
        assert torch.allclose(exported[name], twin[name], rtol=1e-5, atol=1e-6), name
    assert any(not torch.equal(original[k], exported[k]) for k in shards[0])  # the steps changed the weights
