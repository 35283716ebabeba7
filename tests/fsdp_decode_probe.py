"""One rank of the FSDP2 decode-copy probe, run under `torch.distributed.run` by tests/test_decode_copy.py (2 CPU
ranks on gloo) and tests/gpu/test_decode_copy_gpu.py (1 GPU rank on NCCL).

    python -m torch.distributed.run --standalone --nproc_per_node N fsdp_decode_probe.py MODEL lora|full OUT DEVICE CHECK

CHECK `greedy` (fp32): the graph decoder (its eager twin on the CPU) on the decode copy of the `fully_shard`ed
model against `generate` on the unsharded one, before and after an optimizer step on the shards; `sampling`
(bf16, CUDA): 512 sampled completions of each, their mean log-prob and lengths (benchmarks/sampling_check.py);
`first-forward` / `no-first-forward`: a LoRA backward after a rollout on the copy and a reference forward
under disable_adapter, with or without the rollout's first forward (`backward_after_reference`).
Each rank writes OUT/rank<R>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, GenerationConfig

from grpo_tui.train.decode_copy import DecodeCopy
from grpo_tui.train.generation import Sampling, StaticDecoder, cut_at_eos

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_decode_copy import lora_model  # noqa: E402 - tests/ is no package: found by path

EOS, PAD = [4], 0


def main(path: str, adapters: str, out: str, device: str, check: str) -> None:
    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.set_num_threads(1)
    dtype = torch.bfloat16 if check == "sampling" else torch.float32

    def make() -> torch.nn.Module:
        model = lora_model(Path(path)) if adapters == "lora" else AutoModelForCausalLM.from_pretrained(path).eval()
        return model.to(device=device, dtype=dtype)

    if check in ("first-forward", "no-first-forward"):
        Path(out, f"rank{rank}.json").write_text(json.dumps(backward_after_reference(path, device, check)))
        dist.barrier()
        os._exit(0)
    model, ref = make(), make()
    base = model.get_base_model() if adapters == "lora" else model
    for layer in base.model.layers:
        fully_shard(layer)
    fully_shard(model)
    count = 512 if check == "sampling" else 6
    g = torch.Generator().manual_seed(10 + rank)  # each rank decodes its own prompts
    lengths = torch.randint(3, 7, (count,), generator=g).tolist()
    prompts = [torch.randint(5, 80, (n,), generator=g).tolist() for n in lengths]
    new = 16 if check == "sampling" else 10
    decode, decoder = DecodeCopy("keep"), StaticDecoder(use_graph=cuda)
    decode.build(model)

    def ours(sampling: Sampling) -> list[list[int]]:
        plain = decode.refresh(model)
        with torch.no_grad():
            return decoder.generate(plain, prompts, new, EOS, PAD, sampling).ids

    def theirs(**sampling) -> list[list[int]]:
        width = max(map(len, prompts))
        ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        config = GenerationConfig(
            max_new_tokens=new, pad_token_id=PAD, eos_token_id=EOS, disable_compile=True, **sampling
        )
        with torch.no_grad():
            return cut_at_eos(
                ref.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:], EOS
            )

    result: dict = {"sharded": all(hasattr(p, "full_tensor") for p in model.parameters())}
    if check == "sampling":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
        from sampling_check import mean_logprob, standard_error

        torch.manual_seed(1)
        runs = {"graph": ours(Sampling()), "generate": theirs(do_sample=True, top_k=0, top_p=1.0, temperature=1.0)}
        for name, completions in runs.items():
            mean, per = mean_logprob(ref, prompts, completions, PAD, rows=128)
            sizes = [float(len(c)) for c in completions]
            result[name] = {
                "mean_logprob": mean,
                "mean_logprob_se": standard_error(per),
                "length_mean": sum(sizes) / len(sizes),
                "length_mean_se": standard_error(sizes),
                "completions": len(completions),
            }
    else:
        result.update(before=ours(Sampling(greedy=True)), before_ref=theirs(do_sample=False))
        # One optimizer step on the shards (each rank its own batch; FSDP averages the gradients), big enough to
        # move the greedy tokens; the unsharded reference then takes the gathered weights.
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
        ids = torch.randint(5, 80, (4, 8), generator=g).to(device)
        logits = model(input_ids=ids).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            ref_params = dict(ref.named_parameters())
            for name, param in model.named_parameters():
                ref_params[name].copy_(param.full_tensor())
        result.update(after=ours(Sampling(greedy=True)), after_ref=theirs(do_sample=False))
    result.update(builds=decode.builds, captures=decoder.captures)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # gloo's threads intermittently abort in the interpreter's teardown on CPU


def backward_after_reference(path: str, device: str, check: str) -> dict:
    """As accelerate prepares LoRA under FSDP2 with bf16 mixed precision (fp32 adapters, bf16 frozen base):
    the rollout on the copy (with or without its first forward), then TRL's order: the reference log-probs
    under `disable_adapter`, then the loss forward and backward."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import MixedPrecisionPolicy

    from grpo_tui.train.rollouts import Rollouts

    model = lora_model(Path(path)).to(device=device, dtype=torch.bfloat16)
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.get_base_model().model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    trainer = SimpleNamespace(
        model=model,
        model_wrapped=model,
        is_fsdp_enabled=True,
        accelerator=SimpleNamespace(is_fsdp2=True, device=torch.device(device), num_processes=dist.get_world_size()),
    )
    rollouts = Rollouts.__new__(Rollouts)  # the copy half only
    rollouts.trainer, rollouts.copy, rollouts.decoder = trainer, DecodeCopy("keep", torch.bfloat16), None
    rollouts._fresh = False
    if check == "no-first-forward":
        rollouts._first_forward = lambda: None
    rollouts.decode_model()
    ids = torch.randint(5, 80, (2, 6), device=device)
    with torch.no_grad(), model.disable_adapter():
        model(input_ids=ids)
    try:
        model(input_ids=ids).logits.float().sum().backward()
    except RuntimeError as exc:
        return {"backward": str(exc).splitlines()[0]}
    grads = {p.grad.dtype for p in model.parameters() if p.requires_grad}
    return {"backward": "ok", "grad_dtypes": sorted(map(str, grads))}


if __name__ == "__main__":
    main(*sys.argv[1:6])
