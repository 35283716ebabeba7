"""grpo.generation_backend on the CPU: the static-cache decoder's eager twin against `model.generate`.

The graph backend replays exactly `decode_step`; here that step runs eagerly (fp32, tiny Qwen3), so
greedy decoding must match TRL's generate path token for token, and follow weights changed in place.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, GenerationConfig

from grpo_tui.config.schema import GENERATION_BACKENDS, PresetError, validate_data
from grpo_tui.train import decode_step, generation
from grpo_tui.train.decode_step import decode_and_take
from grpo_tui.train.generation import StaticDecoder
from grpo_tui.train.rollouts import choose_backend
from grpo_tui.train.sampling import Sampling, choose_tokens, cut_at_eos, seen_tokens

# "1+2=", "12+34=", "7+45=", "99+9=", "3+4", "56+78=", "5+5=", "80+1=" in the tiny tokenizer: different
# lengths, so rows are left-padded by different amounts.
PROMPTS = [
    [4, 75, 5, 83],
    [4, 5, 75, 6, 7, 83],
    [10, 75, 7, 8, 83],
    [12, 12, 75, 12, 83],
    [6, 75, 7],
    [8, 9, 75, 10, 11, 83],
    [8, 75, 8, 83],
    [11, 3, 75, 4, 83],
]
# The digit "1" as EOS: greedy decoding (12 tokens, the model's own <eos> not stopping it) emits it first at
# steps 0 to 10 in some rows and never in others, so rows stop at different steps and some run the full length.
EOS = [4]
MAX_NEW = 12
PAD = 0


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def model(tiny_model_path: Path, request: pytest.FixtureRequest) -> torch.nn.Module:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation=request.param
    )
    return model.eval()


def reference(model: torch.nn.Module, prompts: list[list[int]], eos: list[int], **sampling) -> list[list[int]]:
    """TRL's generate path: left padding, `model.generate`, completions cut after the first EOS."""
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    config = GenerationConfig(
        max_new_tokens=MAX_NEW, pad_token_id=PAD, eos_token_id=eos, disable_compile=True, **sampling
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return cut_at_eos(out[:, width:], eos)


def decode(decoder: StaticDecoder, model: torch.nn.Module, eos: list[int], sampling: Sampling, prompts=PROMPTS):
    with torch.no_grad():
        return decoder.generate(model, prompts, MAX_NEW, eos, PAD, sampling).ids


def test_greedy_matches_generate_token_for_token(model: torch.nn.Module) -> None:
    eos = EOS
    expected = reference(model, PROMPTS, eos, do_sample=False)
    got = decode(StaticDecoder(use_graph=False), model, eos, Sampling(greedy=True))
    assert got == expected
    lengths = [len(row) for row in got]
    assert min(lengths) < MAX_NEW  # some rows stopped at EOS ...
    assert all(row[-1] in eos for row in got if len(row) < MAX_NEW)  # ... and end on it
    assert any(eos[0] not in row for row in got)  # a row that never met EOS runs the full length


def test_sampling_with_a_seed_gives_valid_completions(model: torch.nn.Module) -> None:
    vocab = model.config.vocab_size
    eos = EOS
    prompts = PROMPTS * 8
    for sampling in (Sampling(), Sampling(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3)):
        decoder = StaticDecoder(use_graph=False)
        torch.manual_seed(0)
        first = decode(decoder, model, eos, sampling, prompts)
        torch.manual_seed(0)
        assert decode(decoder, model, eos, sampling, prompts) == first  # the seed fixes the rollout
        assert len(first) == len(prompts)
        for row in first:
            assert 1 <= len(row) <= MAX_NEW and all(0 <= t < vocab for t in row)
            assert len(row) == MAX_NEW or row[-1] in eos
            assert all(t not in eos for t in row[:-1])


def test_sampling_follows_generate_under_the_same_seed(model: torch.nn.Module) -> None:
    # 8 prompts fill the decoder's row bucket exactly, so both draw the same random numbers per step.
    prompts, eos = PROMPTS, EOS
    params = {"temperature": 0.8, "top_k": 30, "top_p": 0.95}
    torch.manual_seed(3)
    expected = reference(model, prompts, eos, do_sample=True, **params)
    torch.manual_seed(3)
    assert decode(StaticDecoder(use_graph=False), model, eos, Sampling(**params), prompts) == expected


def test_choose_tokens_applies_transformers_warpers_in_order() -> None:
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    history = torch.randint(0, 50, (4, 7))
    sampling = Sampling(temperature=0.7, top_k=25, top_p=0.8, min_p=0.1, repetition_penalty=1.5)
    scores = RepetitionPenaltyLogitsProcessor(1.5)(history, logits.clone())
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(25), TopPLogitsWarper(0.8), MinPLogitsWarper(0.1)):
        scores = warper(history, scores)
    torch.manual_seed(1)
    expected = torch.multinomial(scores.softmax(-1), 1).squeeze(1)
    torch.manual_seed(1)
    assert torch.equal(choose_tokens(logits, sampling, seen_tokens(history, logits.size(-1))), expected)


def test_decoder_follows_weights_updated_in_place(model: torch.nn.Module) -> None:
    eos = [1]
    decoder = StaticDecoder(use_graph=False)
    before = decode(decoder, model, eos, Sampling(greedy=True))
    state = decoder.state
    saved = [p.detach().clone() for p in model.parameters()]
    try:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # as an optimizer step does: the same storage, new values
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
        after = decode(decoder, model, eos, Sampling(greedy=True))
        assert decoder.state is state  # same bucket: the cache was reset, not rebuilt
        assert after == reference(model, PROMPTS, eos, do_sample=False)
        assert after != before
    finally:
        with torch.no_grad():
            for p, old in zip(model.parameters(), saved, strict=True):
                p.copy_(old)


def test_a_larger_rollout_moves_to_a_larger_bucket(model: torch.nn.Module) -> None:
    decoder = StaticDecoder(use_graph=False)
    decode(decoder, model, [1], Sampling(greedy=True), PROMPTS[:2])
    small = decoder.state
    decode(decoder, model, [1], Sampling(greedy=True), PROMPTS[:1])
    assert decoder.state is small  # a rollout that fits reuses the bucket
    decode(decoder, model, [1], Sampling(greedy=True), PROMPTS * 3)
    assert decoder.state is not small and decoder.state.rows >= len(PROMPTS) * 3


def test_the_cache_is_as_long_as_the_rollout_needs(model: torch.nn.Module) -> None:
    # Every slot holds keys and values for every row: rounding the length up (to 128 before) made the graph's
    # rollout peak heavier than generate's, whose cache grows only to what it needs
    decoder = StaticDecoder(use_graph=False)
    decode(decoder, model, EOS, Sampling(greedy=True))
    width = max(map(len, PROMPTS))
    assert decoder.state.length == width + MAX_NEW
    assert all(layer.keys.size(2) == width + MAX_NEW for layer in decoder.state.cache.layers)


@pytest.mark.parametrize("tokens, min_columns", [(1, 1), (1, 4), (9, 1)])
def test_a_prefill_in_column_chunks_matches_generate(model: torch.nn.Module, monkeypatch, tokens, min_columns) -> None:
    # transformers' forward takes the prompt in chunks of columns (bounding the prefill's transient memory); each
    # chunk writes where the last stopped, and the tokens are generate's
    monkeypatch.setattr(decode_step, "PREFILL_TOKENS", tokens)
    monkeypatch.setattr(decode_step, "PREFILL_MIN_COLUMNS", min_columns)
    decoder = StaticDecoder(use_graph=False)
    prefills: list[list[int]] = []  # the columns of each forward, per prefill call
    real_prefill, real_forward = generation.prefill, decode_step.forward_columns

    def recording_prefill(*args):
        prefills.append([])
        monkeypatch.setattr(
            decode_step,
            "forward_columns",
            lambda m, st, ids, *a: prefills[-1].append(ids.size(1)) or real_forward(m, st, ids, *a),
        )
        try:
            return real_prefill(*args)
        finally:
            monkeypatch.setattr(decode_step, "forward_columns", real_forward)

    monkeypatch.setattr(generation, "prefill", recording_prefill)
    got = decode(decoder, model, EOS, Sampling(greedy=True))
    assert got == reference(model, PROMPTS, EOS, do_sample=False)
    width, columns = max(map(len, PROMPTS)), decode_step.prefill_columns(decoder.state.rows)
    assert columns == max(min_columns, tokens // decoder.state.rows)
    assert prefills[-1] == [min(columns, width - start) for start in range(0, width, columns)]


@pytest.mark.parametrize("pack_tokens, cache_share", [(1, 0.0), (9, 0.0), (8192, 0.0), (1, 0.5)])
def test_the_fused_copy_prefills_whole_prompts_without_padding(
    model: torch.nn.Module, monkeypatch, pack_tokens: int, cache_share: float
) -> None:
    # On the fused copy the prompts go through with no padding, whole rows up to PREFILL_PACK_TOKENS a forward, or
    # PREFILL_CACHE_SHARE of the cache's slots where that is more (a longer row alone); the bucket's filler rows
    # (11 prompts in 16 rows) in no forward; the tokens are generate's
    from test_decode_model import on_copy  # (it imports this module)

    from grpo_tui.train import decode_model

    monkeypatch.setattr(decode_step, "PREFILL_PACK_TOKENS", pack_tokens)
    monkeypatch.setattr(decode_step, "PREFILL_CACHE_SHARE", cache_share)
    prompts = PROMPTS + PROMPTS[:3]
    packs: list[list[int]] = []  # the tokens of each packed forward
    real = decode_model.prefill_packed

    def recording(fused, cache, ids, *args):
        packs.append(ids.tolist())
        return real(fused, cache, ids, *args)

    monkeypatch.setattr(decode_step, "fused_prefill", recording)
    monkeypatch.setattr(decode_step, "_prefill_in_columns", None)  # the padded path is not taken
    decoder = StaticDecoder(use_graph=False)
    got = decode(decoder, on_copy(model)[1], EOS, Sampling(greedy=True), prompts)
    assert got == reference(model, prompts, EOS, do_sample=False)
    assert decoder.state.rows == 16 and [t for pack in packs for t in pack] == [t for p in prompts for t in p]
    budget = max(pack_tokens, int(decoder.state.rows * decoder.state.length * cache_share))
    expected, tokens = [], budget
    for prompt in prompts:
        if tokens + len(prompt) > budget:
            expected.append(0)
            tokens = 0
        expected[-1] += len(prompt)
        tokens += len(prompt)
    assert [len(pack) for pack in packs] == expected
    if cache_share:  # half of a cache of prompts + completions holds every prompt: one forward
        assert len(packs) == 1


def test_other_sampling_settings_get_a_bucket_of_their_own(model: torch.nn.Module) -> None:
    # The graph bakes the sampling settings, EOS ids and pad id into its step: a change must not replay the old ones.
    decoder = StaticDecoder(use_graph=False)
    decode(decoder, model, [1], Sampling(greedy=True))
    first = decoder.state
    decode(decoder, model, [1], Sampling(greedy=True))
    assert decoder.state is first
    decode(decoder, model, [1, 2], Sampling(greedy=True))
    assert decoder.state is not first and decoder.state.eos.tolist() == [1, 2]
    second = decoder.state
    decode(decoder, model, [1, 2], Sampling(temperature=0.5))
    assert decoder.state is not second and decoder.state.sampling == Sampling(temperature=0.5)


def test_cut_at_eos_keeps_the_first_eos() -> None:
    tokens = torch.tensor([[4, 1, 0, 0], [4, 5, 6, 7], [2, 3, 2, 1]])
    assert cut_at_eos(tokens, [1, 2]) == [[4, 1], [4, 5, 6, 7], [2]]


def test_auto_is_graph_on_cuda_where_it_can_run_else_generate() -> None:
    assert choose_backend("auto", "cpu", []) == ("generate", None)
    assert choose_backend("auto", "cuda", []) == ("graph", None)
    assert choose_backend("auto", "cuda", ["FSDP reshards the parameters between forwards"]) == ("generate", None)
    assert choose_backend("graph", "cuda", []) == ("graph", None)
    assert choose_backend("generate", "cuda", []) == ("generate", None)
    assert choose_backend("static", "cuda", []) == ("static", None)
    used, reason = choose_backend("graph", "cpu", [])
    assert used == "generate" and "CUDA" in reason
    used, reason = choose_backend("graph", "cuda", ["FSDP reshards the parameters between forwards"])
    assert used == "generate" and "FSDP" in reason
    with pytest.raises(ValueError, match="allowed: auto, generate, static, graph"):
        choose_backend("fast", "cuda", [])


def test_unknown_backend_is_one_line_listing_the_allowed() -> None:
    with pytest.raises(PresetError) as caught:
        validate_data({"grpo": {"generation_backend": "sglang"}}, "p.toml")
    (line,) = caught.value.lines
    assert line.startswith("p.toml: grpo.generation_backend: got 'sglang'")
    assert all(f"'{name}'" in line for name in GENERATION_BACKENDS)
    assert validate_data({"grpo": {"generation_backend": "graph"}}, "p.toml").grpo.generation_backend == "graph"


def test_graph_on_cpu_falls_back_with_a_note_and_an_event(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from test_trainer import make_run, run_steps

    run = make_run(tmp_path, "graph-cpu", grpo={"max_steps": 1, "generation_backend": "graph"})
    code, steps, events = run_steps(run)
    assert code == 0 and len(steps) == 1
    (fallback,) = [e for e in events if e["event"] == "generation_fallback"]
    assert fallback["requested"] == "graph" and fallback["used"] == "generate" and "CUDA" in fallback["reason"]
    assert "grpo.generation_backend graph cannot run (needs a CUDA device" in capsys.readouterr().out
    # The step record names the backend that ran and counts what it generated (TRL's mean length x rows).
    (step,) = steps
    assert step["generation/backend"] == "generate"
    rows = run.load_preset().grpo.per_device_batch_size
    assert step["generation/tokens"] == pytest.approx(step["completions/mean_length"] * rows, abs=0.5)
    assert step["generation/tokens_per_s"] == pytest.approx(
        step["generation/tokens"] / step["time_s/generation"], rel=0.01
    )


class PastKeyValuesModel(torch.nn.Module):
    """A model with transformers 5.17's forward: the cache comes as `past_key_values`, and an unknown keyword
    (5.2x's `cache`) vanishes into **kwargs, so a caller using the wrong name silently gets a fresh cache."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
        kwargs.pop("cache", None)
        inner_name = "cache" if "cache" in inspect.signature(type(self.inner).forward).parameters else "past_key_values"
        kwargs[inner_name] = past_key_values
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)


def test_the_cache_goes_under_the_name_the_model_takes(model: torch.nn.Module) -> None:
    from grpo_tui.train.decode_step import cache_argument

    older = PastKeyValuesModel(model)
    assert cache_argument(older) == "past_key_values"
    assert cache_argument(model) in inspect.signature(type(model).forward).parameters
    # Before the fix the decoder passed `cache=` whatever the model took: on 5.17 every step saw one key.
    got = decode(StaticDecoder(use_graph=False), older, EOS, Sampling(greedy=True))
    assert got == reference(model, PROMPTS, EOS, do_sample=False)


def test_cache_argument_looks_through_peft(model: torch.nn.Module) -> None:
    from peft import LoraConfig, get_peft_model

    from grpo_tui.train.decode_step import cache_argument

    wrapped = get_peft_model(PastKeyValuesModel(model), LoraConfig(r=2, target_modules=["q_proj"]))
    assert cache_argument(wrapped) == "past_key_values"


def tiny_trainer(tmp_path: Path, *sets: str):
    from grpo_tui.config.store import load_preset
    from grpo_tui.runs.folder import RunDir
    from grpo_tui.train.assemble import build_trainer

    preset, _ = load_preset("tiny-cpu", ["grpo.max_completion_length=8", *sets])
    return build_trainer(preset, RunDir(tmp_path))


@pytest.mark.parametrize("sub_batch", [None, 8])
def test_trainer_hook_with_the_eager_twin_matches_trl(
    tiny_model_path: Path, tmp_path: Path, sub_batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's `_generate_single_turn` through the decoder samples what TRL's path samples (same seed)."""
    trainer = tiny_trainer(tmp_path, *([] if sub_batch is None else [f"grpo.generation_sub_batch={sub_batch}"]))
    assert trainer.rollouts.backend == "generate"  # auto on the CPU
    prompts = PROMPTS * 2  # two slices of 8 with sub_batch 8: each fills the decoder's row bucket
    torch.manual_seed(5)
    expected, logprobs = trainer._generate_single_turn(prompts, None, {}, 8)
    trainer.rollouts.decoder = StaticDecoder(use_graph=False)  # what `graph` does, without the capture
    torch.manual_seed(5)
    default, _ = trainer._generate_single_turn(prompts, None, {}, 8)
    first = 8 if sub_batch else len(prompts)
    assert default[:first] == expected[:first]  # the first slice starts from the same random state
    # generate stops at the step where every row has finished; the decoder looks only every FINISH_CHECK_EVERY
    # steps (each look waits for the GPU), so it may draw a few more tokens' worth of random numbers per slice and
    # a second slice then starts from another random state. Looking at every step, both draw alike throughout.
    monkeypatch.setattr(generation, "FINISH_CHECK_EVERY", 1)
    torch.manual_seed(5)
    got, our_logprobs = trainer._generate_single_turn(prompts, None, {}, 8)
    assert got == expected and logprobs is None
    # The decoder returns each token's log-prob (TRL carries them as sampling_per_token_logps)
    assert [len(row) for row in our_logprobs] == [len(row) for row in got]
    assert all(value <= 0.0 for row in our_logprobs for value in row)
    # The rollout's bucket is freed before scoring and the loss (on the H200 keeping it cost ~10 GiB of peak).
    assert trainer.rollouts.decoder.state is None
    assert trainer.rollouts.take_stats().tokens == sum(map(len, expected)) + sum(map(len, default)) + sum(map(len, got))


def test_static_backend_sets_transformers_static_cache(tiny_model_path: Path, tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, "grpo.generation_backend=static")
    assert trainer.rollouts.backend == "static" and trainer.rollouts.decoder is None
    config = trainer.generation_config
    assert config.cache_implementation == "static" and not config.disable_compile
    torch.manual_seed(5)
    completions, _ = trainer._generate_single_turn(PROMPTS, None, {}, 8)
    assert len(completions) == len(PROMPTS) and all(1 <= len(c) <= 8 for c in completions)


def test_checks_note_where_graph_will_fall_back() -> None:
    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.schema import Preset

    def notes(**sections) -> list[str]:
        result = check_preset(Preset.model_validate(sections), environment=False)
        assert result.ok
        return [n for n in result.notes if n.startswith("grpo.generation_backend")]

    assert notes(grpo={"generation_backend": "graph"}) == []
    assert "needs CUDA" in notes(grpo={"generation_backend": "graph"}, distributed={"use_cpu": True})[0]
    graph = {"generation_backend": "graph"}
    fsdp1, fsdp2 = {"fsdp": True, "fsdp_version": 1}, {"fsdp": True, "fsdp_version": 2}
    assert "FSDP1" in notes(grpo=graph, distributed=fsdp1)[0]
    assert notes(grpo=graph, distributed=fsdp2) == []  # FSDP2 decodes on the decode copy
    assert "decode_copy = off" in notes(grpo={**graph, "decode_copy": "off"}, distributed=fsdp2)[0]
    flash = {"attn_implementation": "flash_attention_2"}
    assert "flash_attention_2" in notes(grpo={"generation_backend": "graph"}, model=flash)[0]
    assert notes(grpo={"generation_backend": "auto"}, distributed={"fsdp": True}) == []


def test_benchmark_smoke_on_cpu(tiny_model_path: Path, tmp_path: Path) -> None:
    bench = load_benchmark("generation_bench")
    argv = [
        "--device",
        "cpu",
        "--tiny",
        "--batches",
        "8",
        "--new-tokens",
        "4",
        "--samples",
        "8",
        "--backends",
        "graph,generate,static,graph-plain@math,graph-hf",
        "--no-sampling",
        "graph-plain@math,graph-hf",
        "--profile-batch",
        "8",
        "--fresh",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert bench.main(argv) == 0
    result = json.loads((tmp_path / "generation-bench.json").read_text())
    assert all(len(r["fresh_s"]) == 2 and r["fresh_tokens_per_s"] > 0 for r in result["throughput"])
    backends = ["graph", "generate", "static", "graph-plain@math", "graph-hf"]
    assert [r["backend"] for r in result["throughput"]] == backends
    table = (tmp_path / "profile-graph-plain_at_math-8-4.txt").read_text()  # one per backend profiled at batch 8
    assert "one rollout, graph-plain@math, 8 x 4 tokens" in table and "aten::" in table
    assert (tmp_path / "profile-generate-8-4.txt").is_file()
    assert [p["backend"] for p in result["profiles"]] == backends
    assert all(p["wall_ms"] > 0 and p["kinds"] == {} for p in result["profiles"])  # no device kernels on the CPU
    assert all("first_call_peak_mib" in r for r in result["throughput"])
    assert all(r["tokens_per_s"] > 0 and 0 < r["bound_fraction"] for r in result["throughput"])
    assert all(0 < r["prefill_s"] < r["s"] and r["decode_tokens_per_s"] > 0 for r in result["throughput"])
    # The trainer's graph decodes on the fused decode copy; graph-hf on the live weights, as with decode_copy = off
    copies = {r["backend"]: r["decode_copy_mib"] for r in result["throughput"]}
    assert copies["graph"] > 0 and copies["graph-plain@math"] > 0 and copies["graph-hf"] is None
    for check in result["sampling"]:
        assert check["completions"] == 8 and 1 <= check["length_mean"] <= 4 and check["mean_logprob"] < 0
        assert check["mean_logprob_se"] > 0 and check["length_mean_se"] >= 0
    assert [m["backend"] for m in result["sampling_match"]] == ["graph", "static"]


def test_benchmark_sorts_kernels_by_kind() -> None:
    """Kernel names as an H200 profile of a rollout lists them."""
    kind = load_benchmark("generation_bench").kernel_kind
    names = {
        "_split_kernel": "decode attention",
        "_merge_kernel": "decode attention",
        "nvjet_sm90_tst_24x64_64x16_4x2_h_bz_TNN": "GEMM",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float>": "GEMM",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16": "prefill attention",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "prefill attention",  # sdpa's memory-efficient kernel
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "GEMM",
        "triton_red_fused__softmax__to_copy__unsafe_view_any_argmax_0": "sampling and log-probs",
        "_token_slices_kernel": "sampling and log-probs",  # grpo_kernels.token_choice
        "_token_pick_kernel": "sampling and log-probs",
        "triton_per_fused__to_copy__unsafe_view_add_arange_cat_cos_1": "fused elementwise (torch.compile)",
        # inductor names a kernel after its ops: this one feeds our decode attention, and is elementwise
        "triton_per_fused_add_bitwise_and_cos_decode_attention_index_copy_5": "fused elementwise (torch.compile)",
        "Memcpy HtoD (Pageable -> Device)": "copies and fills",
        "void at::native::elementwise_kernel<128, 4>": "other",
    }
    assert {name: kind(name) for name in names} == names


def test_benchmark_profile_lists_the_longest_kernels_by_name() -> None:
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name: str, us: float, device=DeviceType.CUDA) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [event("_split_kernel", 50.0), event("_split_kernel", 52.0), event("nvjet_sm90_tst_24x64", 6.0)]
    events += [event("aten::mm", 900.0, DeviceType.CPU)]  # host events count nowhere
    got = load_benchmark("generation_bench").kernel_kinds(SimpleNamespace(events=lambda: events), 0.5)
    assert got["wall_ms"] == 500.0 and got["device_busy_ms"] == 0.1
    assert got["kinds"] == {"GEMM": {"ms": 0.01, "launches": 1}, "decode attention": {"ms": 0.1, "launches": 2}}
    assert got["kernels"] == [
        {"name": "_split_kernel", "kind": "decode attention", "ms": 0.102, "launches": 2},
        {"name": "nvjet_sm90_tst_24x64", "kind": "GEMM", "ms": 0.006, "launches": 1},
    ]


def test_benchmark_refuses_bad_batches(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bench = load_benchmark("generation_bench")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", "--tiny", "--batches", "8,x", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--batches: got '8,x'; allowed: comma-separated positive integers" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=12).filter(lambda t: not t.isdecimal()) | st.sampled_from(["-1", "1.5", " 2", "1e3", ""]))
def test_benchmark_fresh_is_a_whole_number_or_one_error(text: str) -> None:
    bench = load_benchmark("generation_bench")
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
        bench.main(["--device", "cpu", "--tiny", f"--fresh={text}", "--out", "/nonexistent/never-written"])
    assert exit_info.value.code == 2
    assert f"--fresh: got {text!r}; allowed: a whole number of rollouts, 0 or more" in err.getvalue()


@pytest.fixture
def decode_knobs(monkeypatch) -> None:
    """The decode kernel's settings and the decoder's compile options, restored after the test."""
    import grpo_kernels.decode_attention as da
    from grpo_tui.train import generation

    for name in load_benchmark("decode_attention_bench").SETTINGS.values():
        monkeypatch.setattr(da, name, getattr(da, name))
    monkeypatch.setattr(generation, "DECODE_COMPILE_OPTIONS", generation.DECODE_COMPILE_OPTIONS)


def test_benchmark_sets_the_decode_kernel_and_compile_options_it_is_given(decode_knobs) -> None:
    import grpo_kernels.decode_attention as da
    from grpo_tui.train import generation

    options = load_benchmark("generation_bench").decode_options
    target = da.TARGET_PROGRAMS
    assert options("max_autotune", "stages=3;warps=8") == (["max_autotune"], {"stages": 3, "warps": 8})
    assert da.NUM_STAGES == 3 and da.NUM_WARPS == 8 and da.TARGET_PROGRAMS == target
    assert generation.DECODE_COMPILE_OPTIONS == {"max_autotune": True}
    assert generation.StaticDecoder(use_graph=False, compiled=True).compiled  # torch.compile takes the options


@settings(max_examples=80, deadline=None)
@given(
    inductor=st.sampled_from(["", "max_autotune", "coordinate_descent_tuning,max_autotune"]) | st.text(max_size=20),
    attention=st.sampled_from(["", "warps=8", "block=128;stages=3", "target=0", "rowsplit=1", "warps=4;warps=8"])
    | st.text(max_size=20),
)
def test_benchmark_decode_options_of_any_text_are_set_or_one_line(inductor: str, attention: str) -> None:
    import grpo_kernels.decode_attention as da
    from grpo_tui.train import generation

    options = load_benchmark("generation_bench").decode_options
    saved = {n: getattr(da, n) for n in load_benchmark("decode_attention_bench").SETTINGS.values()}
    compile_options = generation.DECODE_COMPILE_OPTIONS
    try:
        got_inductor, got_attention = options(inductor, attention)
    except ValueError as error:
        assert str(error).startswith(("--inductor: got", "--attention: got")) and "\n" not in str(error)
        assert "allowed:" in str(error)
    else:
        assert got_inductor == [n for n in inductor.split(",") if n]
        assert all(isinstance(v, int) for v in got_attention.values())
    finally:
        for name, value in saved.items():
            setattr(da, name, value)
        generation.DECODE_COMPILE_OPTIONS = compile_options


def test_benchmark_refuses_a_bad_decode_option_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bench = load_benchmark("generation_bench")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", "--tiny", "--attention", "warps=0", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--attention: got 'warps=0'; allowed: NAME=INT" in capsys.readouterr().err.splitlines()[-1]
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", "--tiny", "--blas", "mkl", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert "--blas: invalid choice: 'mkl'" in last and "'cublaslt'" in last
    assert not (tmp_path / "generation-bench.json").exists()


class RecordingBackend:
    """A benchmark backend that only records its calls: "release", and each rollout's prompt width."""

    name = "graph"

    def __init__(self) -> None:
        self.calls: list[object] = []

    def release(self) -> None:
        self.calls.append("release")

    def run(self, prompts, new_tokens, stop_ids, ignore_eos):
        self.calls.append(max(map(len, prompts)))
        return [[1] * new_tokens for _ in prompts]


def test_benchmark_fresh_rollouts_start_over_as_the_trainer_does() -> None:
    # Each one frees the bucket and gets prompts with 8 more leading tokens cut: a new cache length each time
    bench = load_benchmark("generation_bench")
    backend = RecordingBackend()
    row = bench.measure(backend, [[5] * 20, [7] * 12], 4, [2], torch.device("cpu"), fresh=2)
    assert backend.calls == ["release", 20, 20, 20, "release", 12, "release", 4]  # first, timed, prefill alone
    assert len(row["fresh_s"]) == 2 and row["fresh_tokens_per_s"] > 0 and row["fresh_peak_mib"] is None


def test_benchmark_sampling_match_is_in_units_of_the_combined_standard_error() -> None:
    bench = load_benchmark("generation_bench")
    assert bench.standard_error([1.0, 3.0]) == pytest.approx(1.0)  # sd sqrt(2) over sqrt(2)
    base = {"backend": "generate", "mean_logprob": -5.0, "mean_logprob_se": 0.03, "length_mean": 100.0}
    base["length_mean_se"] = 4.0
    near = {**base, "backend": "graph", "mean_logprob": -5.1, "length_mean": 110.0}  # z -2.36, +1.77
    far = {**base, "backend": "static", "mean_logprob": -5.2}  # z -4.7
    near_row, far_row = bench.sampling_match([base, near, far])
    assert near_row["mean_logprob_z"] == pytest.approx(-0.1 / (0.03 * 2**0.5))
    assert near_row["within_spread"] and not far_row["within_spread"]


def test_a_failed_compile_falls_back_to_the_plain_step_with_a_reason(model: torch.nn.Module) -> None:
    reasons: list[str] = []
    decoder = StaticDecoder(use_graph=False, on_compile_failure=reasons.append)
    decode(decoder, model, EOS, Sampling(greedy=True))  # fits a bucket

    def broken(*args, **kwargs):
        raise RuntimeError("inductor: backend compiler failed\nlong traceback text")

    decoder.compiled, decoder._take = True, broken  # a compiled step that fails (no inductor run on the CPU)
    decoder.state.cache.reset()  # capture follows a fresh bucket's one-token prefill: the cache has room
    with torch.no_grad():
        decoder._compiled_or_plain(lambda: decoder._warm_up(model, decoder.state))  # what capture runs first, on CUDA
    assert not decoder.compiled
    assert reasons == ["torch.compile failed (RuntimeError: inductor: backend compiler failed)"]
    assert decode(decoder, model, EOS, Sampling(greedy=True)) == reference(model, PROMPTS, EOS, do_sample=False)


def test_an_error_of_the_plain_step_is_not_swallowed(model: torch.nn.Module) -> None:
    decoder = StaticDecoder(use_graph=False)
    decode(decoder, model, EOS, Sampling(greedy=True))
    decoder._take = lambda *args: (_ for _ in ()).throw(RuntimeError("CUDA error: out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"), torch.no_grad():
        decoder._compiled_or_plain(lambda: decoder._warm_up(model, decoder.state))


def test_vllm_is_checked_before_launch(monkeypatch) -> None:
    """vllm passes through to TRL (unmeasured here: vLLM cannot be installed on the project's GPU machine), so
    what is tested is the configuration it produces and the checks in front of it."""
    import importlib.util

    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.schema import Preset

    def errors(**sections) -> list[str]:
        result = check_preset(Preset.model_validate(sections), environment=False)
        return [e for e in result.errors if e.startswith("grpo.generation_backend")]

    gpu, vllm = {"use_cpu": False}, {"generation_backend": "vllm"}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    [missing] = errors(grpo=vllm, loss={"impl": "trl"}, distributed=gpu)
    assert "pip install vllm" in missing and "allowed without it: auto, generate, static, graph" in missing
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert errors(grpo=vllm, loss={"impl": "trl"}, distributed=gpu) == []
    assert errors(grpo=vllm, loss={"impl": "naive"}, distributed=gpu) == []
    [chunked] = errors(grpo=vllm, loss={"impl": "chunked"}, distributed=gpu)
    assert "loss.impl chunked" in chunked and "use loss.impl trl or naive" in chunked
    [cpu] = errors(grpo=vllm, loss={"impl": "trl"}, distributed={"use_cpu": True})
    assert "needs a GPU" in cpu
    assert all("\n" not in line for line in (missing, chunked, cpu))


@pytest.mark.parametrize(("backend", "use_vllm"), [("vllm", True), ("graph", False), ("auto", False)])
def test_vllm_sets_trls_colocated_vllm_path(tmp_path: Path, backend: str, use_vllm: bool) -> None:
    from grpo_tui.config.schema import Preset
    from grpo_tui.runs.folder import RunDir
    from grpo_tui.train.config_map import grpo_config

    config = grpo_config(Preset.model_validate({"grpo": {"generation_backend": backend}}), RunDir(tmp_path))
    assert config.use_vllm is use_vllm and config.vllm_mode == "colocate"
    assert choose_backend(backend, "cuda", []) == ("graph" if backend == "auto" else backend, None)


def test_the_first_compile_of_a_bucket_shape_is_announced(model: torch.nn.Module, monkeypatch) -> None:
    """Compiling takes ~35 s on the first rollout: the log says so once per row count, not at every rollout's capture
    nor at each new cache length."""
    shapes: list[tuple[int, int]] = []
    decoder = StaticDecoder(use_graph=True, compiled=True, on_compile_start=lambda *shape: shapes.append(shape))
    monkeypatch.setattr(decoder, "_capture", lambda model, state: None)  # no CUDA here: the step runs eagerly
    monkeypatch.setattr(decoder, "_take", decode_and_take)  # and uncompiled
    decode(decoder, model, EOS, Sampling(greedy=True))
    decoder.release()  # what the trainer does after every rollout
    decode(decoder, model, EOS, Sampling(greedy=True))
    assert shapes == [(decoder.state.rows, decoder.state.length)]
    decode(decoder, model, EOS, Sampling(greedy=True), [p + [5] * 7 for p in PROMPTS])  # longer: the same step
    assert len(shapes) == 1
    decode(decoder, model, EOS, Sampling(greedy=True), PROMPTS * 3)  # more rows: compiled again
    assert len(shapes) == 2 and shapes[1][0] >= len(PROMPTS) * 3


def test_one_compiled_step_serves_every_cache_length(model: torch.nn.Module) -> None:
    """The cache length is exact, so it changes with each batch's prompt width: a step compiled per length would
    compile again at most rollouts (and dynamo stops compiling after 8). Inductor on the CPU, the eager twin."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # nothing compiled by earlier tests (or the other attention) is reused
    decoder = StaticDecoder(use_graph=False, compiled=True)
    compiled: list[int] = []  # graphs dynamo has made, after each rollout
    lengths = set()
    for extra in (0, 3, 10):
        prompts = [p + [5] * extra for p in PROMPTS]
        assert decode(decoder, model, EOS, Sampling(greedy=True), prompts) == reference(
            model, prompts, EOS, do_sample=False
        )
        lengths.add(decoder.state.length)
        decoder.release()
        compiled.append(counters["stats"]["unique_graphs"])
    assert len(lengths) == 3
    assert compiled[0] > 0 and compiled == compiled[:1] * 3


def test_decode_steps_can_be_held_to_chosen_sdpa_kernels(model: torch.nn.Module) -> None:
    # The benchmark compares sdpa's kernels for the decode step (NAME@efficient etc.); the tokens stay generate's.
    decoder = StaticDecoder(use_graph=False, sdpa_backends=("math",))
    assert decode(decoder, model, EOS, Sampling(greedy=True)) == reference(model, PROMPTS, EOS, do_sample=False)
    with pytest.raises(ValueError, match="sdpa backend: got fastest; allowed: cudnn, flash, efficient, math") as error:
        StaticDecoder(use_graph=False, sdpa_backends=("math", "fastest"))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("library", [None, "cublaslt"])
def test_decode_steps_prefer_the_blas_library_asked_for_and_leave_it_after(
    model: torch.nn.Module, monkeypatch, library: str | None
) -> None:
    from grpo_tui.train import generation

    # torch's preference as a plain value: a CPU build refuses cuBLASLt, and cuBLAS is its default already
    preference = {"now": "cublas", "sets": 0}

    def preferred_blas_library(backend=None):
        if backend is not None:
            preference["now"], preference["sets"] = backend, preference["sets"] + 1
        return preference["now"]

    during = []

    def take(*args, **kwargs):
        during.append(preference["now"])
        return decode_and_take(*args, **kwargs)

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred_blas_library)
    monkeypatch.setattr(generation, "decode_and_take", take)
    monkeypatch.setattr(generation, "DECODE_BLAS", library)
    got = decode(StaticDecoder(use_graph=False), model, EOS, Sampling(greedy=True))
    assert got == reference(model, PROMPTS, EOS, do_sample=False)
    assert during and set(during) == {library or "cublas"}
    assert preference["now"] == "cublas"  # restored after the rollout
    assert preference["sets"] == (0 if library is None else 2)


def test_benchmark_measures_each_batch_after_releasing_the_previous_bucket() -> None:
    # The peak is read against the memory held before the call: a bucket left from the previous batch would
    # be freed inside the call and understate the peak by its size
    bench = load_benchmark("generation_bench")
    backend = RecordingBackend()
    row = bench.measure(backend, [[5, 6], [7]], 4, [2], torch.device("cpu"))
    assert backend.calls == ["release", 2, 2, 2]  # released before the memory baseline and the three calls
    assert row["tokens_per_s"] > 0 and row["peak_mib"] is None


def test_the_one_pass_token_choice_decodes_as_the_torch_path(tiny_model_path: Path, token_kernel) -> None:
    # Where grpo_kernels runs and no warper but the temperature is asked, the step's token choice is the kernel's:
    # greedy, generate's tokens; sampled, one torch seed gives the same rollout again, and each token's log-prob is
    # what the torch path scores it with (log_softmax(logits / T) at the token)
    from grpo_tui.train.decode_step import kernel_chooses

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    assert kernel_chooses(Sampling(temperature=0.9), torch.device("cpu"))
    assert not kernel_chooses(Sampling(top_k=5), torch.device("cpu"))
    assert not kernel_chooses(Sampling(repetition_penalty=1.1), torch.device("cpu"))
    decoder = StaticDecoder(use_graph=False, sdpa_backends=())
    assert decode(decoder, model, EOS, Sampling(greedy=True)) == reference(model, PROMPTS, EOS, do_sample=False)
    assert decoder.state.seed is not None
    sampling = Sampling(temperature=0.9)
    with torch.no_grad():
        torch.manual_seed(4)
        first = decoder.generate(model, PROMPTS, MAX_NEW, EOS, PAD, sampling)
        torch.manual_seed(4)
        again = decoder.generate(model, PROMPTS, MAX_NEW, EOS, PAD, sampling)
    assert first == again and len({tuple(row) for row in first.ids}) > 1
    for prompt, ids, logps in zip(PROMPTS, first.ids, first.logprobs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float() / 0.9
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(logps), expected, rtol=1e-4, atol=1e-4)
