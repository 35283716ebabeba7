"""The decode copy (grpo_tui/train/decode_copy.py): full weights with LoRA merged, refreshed in place.

On one process: the merge against peft's own, what cannot merge, ties, buffers, keep and free. On two CPU
processes (gloo) with `fully_shard` called directly (accelerate runs DDP on the CPU, see ENVIRONMENT.md):
the graph decoder's eager twin on the copy of an FSDP2-sharded model decodes, greedy, exactly what
`generate` decodes on the unsharded model, with and without LoRA, and after an optimizer step the next
refresh follows the new weights.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from test_distributed_cpu import _errors
from torchrun import loopback_env, torchrun
from transformers import AutoModelForCausalLM

from grpo_tui.train.decode_copy import DecodeCopy, DecodeCopyError, merge_blockers, merged_tensors
from grpo_tui.train.generation import Sampling, StaticDecoder

TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]


def lora_model(path: Path, seed: int = 0, **config) -> torch.nn.Module:
    """The tiny model with LoRA adapters whose B is not zero (a fresh adapter would change nothing)."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = {"r": 4, "lora_alpha": 8, "target_modules": TARGETS, "lora_dropout": 0.0, **config}
    model = get_peft_model(base, LoraConfig(**config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    return model.eval()


def test_merged_weights_equal_peft_merge_and_the_adapters_stay(tiny_model_path: Path) -> None:
    model = lora_model(tiny_model_path)
    before = {name: p.clone() for name, p in model.named_parameters()}
    decode = DecodeCopy("keep")
    decode.build(model)
    plain = decode.refresh(model)
    merged = copy.deepcopy(model).merge_and_unload()
    expected = dict(merged.named_parameters())
    got = dict(plain.named_parameters())
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-6, msg=name)
    # The trained weights and adapters are only read
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), name
    assert not any(p.requires_grad for p in plain.parameters()) and not plain.training


def test_copy_keeps_ties_and_buffer_dtypes(tiny_model_path: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    # Qwen3-0.6B and 1.7B tie lm_head to the embeddings (the tiny model does not): a tied variant of the tiny one
    config = AutoConfig.from_pretrained(tiny_model_path, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "tied")
    model = lora_model(tmp_path / "tied")
    base = model.get_base_model()
    assert base.lm_head.weight.data_ptr() == base.model.embed_tokens.weight.data_ptr()
    decode = DecodeCopy("keep", dtype=torch.float16)
    plain = decode.build(model)
    decode.refresh(model)
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()  # tied as the source
    assert plain.model.embed_tokens.weight.dtype == torch.float16
    source_buffers = dict(base.named_buffers())
    for name, buffer in plain.named_buffers():
        assert buffer.dtype == source_buffers[name].dtype, name
        assert torch.equal(buffer, source_buffers[name]), name
    assert decode.nbytes == sum(p.numel() * 2 for p in plain.parameters()) + sum(
        b.numel() * b.element_size() for b in plain.buffers()
    )


def test_refresh_follows_changed_weights_in_place(tiny_model_path: Path) -> None:
    model = lora_model(tiny_model_path)
    decode = DecodeCopy("keep")
    decode.build(model)
    plain = decode.refresh(model)
    storage = {name: p.data_ptr() for name, p in plain.named_parameters()}
    with torch.no_grad():
        layer = model.get_base_model().model.layers[0].self_attn.q_proj
        layer.lora_B["default"].weight.add_(1.0)
        layer.base_layer.weight.mul_(0.5)
    again = decode.refresh(model)
    assert again is plain and {name: p.data_ptr() for name, p in again.named_parameters()} == storage
    expected = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    name = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(dict(again.named_parameters())[name], expected[name], rtol=1e-6, atol=1e-6)
    # Adapters disabled (the reference model under beta > 0) merge nothing
    with model.disable_adapter():
        tensors = dict(merged_tensors(model))
    torch.testing.assert_close(tensors[name], layer.base_layer.weight)


def test_free_drops_the_copy_and_keep_holds_it(tiny_model_path: Path) -> None:
    model = lora_model(tiny_model_path)
    for mode, held in (("keep", True), ("free", False)):
        decode = DecodeCopy(mode)
        decode.build(model)
        decode.refresh(model)
        size = decode.nbytes
        decode.after_rollout()
        assert (decode.model is not None) is held
        assert decode.nbytes == (size if held else 0) and decode.last_nbytes == size
    with pytest.raises(ValueError, match="grpo.decode_copy: got 'off'; allowed: keep, free"):
        DecodeCopy("off")
    with pytest.raises(DecodeCopyError, match="refresh before build"):
        DecodeCopy("keep").refresh(model)


def test_adapters_that_cannot_merge_are_named(tiny_model_path: Path) -> None:
    assert merge_blockers(lora_model(tiny_model_path)) == []
    assert merge_blockers(lora_model(tiny_model_path, use_dora=True)) == ["DoRA adapters"]
    saved = lora_model(tiny_model_path, target_modules=["q_proj"], modules_to_save=["lm_head"])
    assert merge_blockers(saved) == ["peft modules_to_save"]
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert merge_blockers(plain) == []


def run_probe(model: Path, adapters: str, out: Path, device: str, check: str, ranks: int) -> list[dict]:
    """tests/fsdp_decode_probe.py on `ranks` processes; each rank's result."""
    probe = Path(__file__).with_name("fsdp_decode_probe.py")
    argv = [*torchrun(ranks), str(probe), str(model), adapters, str(out), device, check]
    env = loopback_env(OMP_NUM_THREADS="1")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=out)
    assert proc.returncode == 0, _errors(proc.stderr)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
@pytest.mark.parametrize("adapters", ["lora", "full"])
def test_fsdp2_decode_copy_matches_generate_and_follows_a_step(
    tiny_model_path: Path, tmp_path: Path, adapters: str
) -> None:
    results = run_probe(tiny_model_path, adapters, tmp_path, "cpu", "greedy", ranks=2)
    for r in results:
        assert r["sharded"]  # every parameter a DTensor shard: the copy gathered them
        assert r["before"] == r["before_ref"]  # token for token, every row
        assert r["after"] == r["after_ref"]
        assert r["builds"] == 1  # refreshed in place, not rebuilt
    assert results[0]["before"] != results[1]["before"]  # each rank decoded its own prompts
    assert any(r["after"] != r["before"] for r in results)  # the step moved the tokens: following it matters


def test_eager_twin_logprobs_are_the_models_own(tiny_model_path: Path) -> None:
    """The log-probs the decoder returns are what a forward over prompt + completion gives (fp32)."""
    model = lora_model(tiny_model_path)
    decode = DecodeCopy("keep")
    decode.build(model)
    plain = decode.refresh(model)
    prompts = [[4, 75, 5, 83], [6, 75, 7]]
    torch.manual_seed(3)
    with torch.no_grad():
        out = StaticDecoder(use_graph=False).generate(plain, prompts, 6, [4], 0, Sampling(temperature=0.7))
        for prompt, ids, logps in zip(prompts, out.ids, out.logprobs):
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / 0.7
            expected = logits.log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(logps), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["keep", "free"])
def test_a_lora_run_decodes_on_the_copy_and_records_it(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A whole LoRA run (beta > 0: the reference is the model with adapters disabled) with its rollouts on the
    copy: the graph's eager twin stands in for the CUDA graph, which the CPU cannot capture."""
    from test_trainer import make_run, run_steps

    from grpo_tui.train import rollouts

    monkeypatch.setattr(rollouts, "choose_backend", lambda requested, device, blockers: ("graph", None))
    monkeypatch.setattr(rollouts, "StaticDecoder", lambda **options: StaticDecoder(use_graph=False))
    peft = {"enabled": True, "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": TARGETS}
    grpo = {"max_steps": 3, "beta": 0.04, "generation_backend": "graph", "decode_copy": mode}
    code, steps, events = run_steps(make_run(tmp_path, mode, grpo=grpo, peft=peft))
    assert code == 0 and len(steps) == 3, events
    assert not [e for e in events if e["event"] == "generation_fallback"]
    for step in steps:
        assert step["generation/backend"] == "graph" and step["generation/decode_copy_mib"] > 0
        assert step["generation/copy_refresh_s"] > 0 and step["kl"] >= 0
        # Decode and training forward compute the same fp32 log-probs (merged vs unmerged adapters)
        assert 0 <= step["generation/logp_mismatch_mean"] <= step["generation/logp_mismatch_max"] < 1e-4
    builds = [step["generation/copy_builds"] for step in steps]
    assert builds == ([1, 0, 0] if mode == "keep" else [1, 1, 1])


def fake_trainer(model: torch.nn.Module, fsdp: bool = False, fsdp2: bool = False, device: str = "cuda"):
    """What `Rollouts` reads of a trainer, for backends chosen as on a CUDA machine."""
    from types import SimpleNamespace

    return SimpleNamespace(
        model=model,
        is_fsdp_enabled=fsdp,
        is_deepspeed_enabled=False,
        use_vllm=False,
        use_transformers_continuous_batching=False,
        _is_vlm=False,
        max_completion_length=8,
        accelerator=SimpleNamespace(is_fsdp2=fsdp2, device=torch.device(device), is_main_process=True, num_processes=1),
        args=SimpleNamespace(bf16=True, fp16=False),
        state=SimpleNamespace(global_step=4),
    )


def test_fsdp2_and_lora_take_the_graph_on_a_copy_and_fsdp1_falls_back(tiny_model_path: Path, capsys) -> None:
    from grpo_tui.train.rollouts import Rollouts

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    lora = lora_model(tiny_model_path)
    cases = {  # (model, fsdp, fsdp2, decode_copy) -> (backend, a copy, the log line's reason)
        "full, no FSDP": ((plain, False, False, "keep"), ("graph", True, None)),  # the fused forward's copy
        "full, copy off": ((plain, False, False, "off"), ("graph", False, None)),
        "LoRA, no FSDP": ((lora, False, False, "keep"), ("graph", True, None)),
        "LoRA unmerged": ((lora, False, False, "off"), ("graph", False, None)),
        "FSDP2": ((plain, True, True, "keep"), ("graph", True, None)),
        "FSDP2 + LoRA, free": ((lora, True, True, "free"), ("graph", True, None)),
        "FSDP2, no copy": ((plain, True, True, "off"), ("generate", False, "grpo.decode_copy is off")),
        "FSDP1": ((plain, True, False, "keep"), ("generate", False, "FSDP1 reshards")),
        "FSDP2 + DoRA": ((lora_model(tiny_model_path, use_dora=True), True, True, "keep"), ("generate", False, "DoRA")),
    }
    for name, ((model, fsdp, fsdp2, mode), (backend, copied, reason)) in cases.items():
        rollouts = Rollouts(fake_trainer(model, fsdp, fsdp2), "graph", decode_copy=mode)
        line = capsys.readouterr().out
        assert rollouts.backend == backend, name
        assert (rollouts.copy is not None) is copied, name
        if copied:
            assert rollouts.copy.mode == mode and rollouts.copy.dtype == torch.bfloat16  # the bf16 compute dtype
        assert (reason in line) if reason else line == "", (name, line)


def test_a_copy_that_cannot_be_built_falls_back_to_generate_for_good(tiny_model_path: Path, capsys) -> None:
    from grpo_tui.train import rollouts as module

    events = []
    rollouts = module.Rollouts(
        fake_trainer(lora_model(tiny_model_path)), "graph", on_event=lambda name, **f: events.append((name, f))
    )

    def out_of_memory(trained):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.20 GiB")

    rollouts.copy.build = out_of_memory
    calls = []

    def default(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls.append(len(prompt_ids))
        return [[1]] * len(prompt_ids), None

    turn = rollouts.single_turn(default)
    assert turn([[3, 4], [5]], None, {}, 2) == ([[1], [1]], None)
    assert rollouts.backend == "generate" and rollouts.decoder is None and rollouts.copy is None
    assert turn([[3]], None, {}, 2) == ([[1]], None) and calls == [2, 1]  # later rollouts go straight to generate
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "the decode copy could not be built" in line and "generate from here on" in line
    assert [(name, f["used"], f["step"]) for name, f in events] == [("generation_fallback", "generate", 5)]


def test_fsdp2_runs_one_forward_before_its_first_copy(tiny_model_path: Path) -> None:
    """FSDP2 reads which parameters train on the model's first forward; on the copy, TRL's first would be the
    reference's under disable_adapter (adapters frozen), so the rollout makes one itself, with adapters on."""
    from grpo_tui.train.rollouts import Rollouts

    model = lora_model(tiny_model_path)
    trainer = fake_trainer(model, fsdp=True, fsdp2=True, device="cpu")
    seen = []
    trainer.model_wrapped = lambda **inputs: seen.append((inputs["input_ids"].shape, torch.is_grad_enabled()))
    rollouts = Rollouts.__new__(Rollouts)  # the copy half only: the CPU cannot capture a graph
    rollouts.trainer, rollouts.copy, rollouts.decoder = trainer, DecodeCopy("free"), None
    rollouts._fresh = False
    for _ in range(2):
        assert rollouts.decode_model() is rollouts.copy.model
        rollouts.end_rollout()
    assert seen == [((1, 1), False)] and rollouts.copy.builds == 2
    trainer.is_fsdp_enabled = False  # without FSDP nothing initialises lazily: no extra forward
    rollouts.copy = DecodeCopy("keep")
    rollouts.decode_model()
    assert len(seen) == 1


@pytest.mark.slow
def test_the_first_forward_keeps_fsdp2_backward_working_after_a_reference_forward(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """Without the rollout's first forward, FSDP2 initialises under disable_adapter and the first backward fails
    (seen on the H200 in the FSDP + LoRA preset's first step); with it the adapters get fp32 gradients."""
    if hasattr(torch.Tensor, "grad_dtype"):  # torch versions that check a gradient's dtype on assignment
        (failed,) = run_probe(tiny_model_path, "lora", tmp_path, "cpu", "no-first-forward", ranks=1)
        assert "attempting to assign a gradient with dtype" in failed["backward"]
    (ok,) = run_probe(tiny_model_path, "lora", tmp_path, "cpu", "first-forward", ranks=1)
    assert ok == {"backward": "ok", "grad_dtypes": ["torch.float32"]}
