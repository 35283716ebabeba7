"""Rollout speed of the grpo.generation_backend choices: generate, static (transformers' built-in), graph.

    python benchmarks/generation_bench.py [--data /work/shared/data/gsm8k/test.jsonl] --out DIR
    python benchmarks/generation_bench.py --device cpu --tiny --out DIR      # smoke mode (tests)

Model: builtin:qwen3-0.6b-shape (the Qwen3-0.6B config, random weights) in bf16, sdpa. Prompts: GSM8K
questions when --data is given, else synthetic token runs of 64..192 tokens.

Throughput: per batch size, 256 new tokens per completion with EOS ignored (equal work). Reported: the first
call (compile / capture / warm-up; 8 tokens for generate), the timed second one (its bucket reused) and, with
--fresh K, K more as the trainer runs them (the bucket released, a new cache length each).

Sampling check (`sampling_check.py`; GRPOConfig's default sampling): >= 512 completions per backend, the mean
log-prob of the sampled tokens and the length distribution. Random weights would almost never emit EOS, so 1%
of the vocabulary (a fixed id set) stops a completion, giving a mean length near 100 tokens.

Bound: each decode step reads every weight once and each row's KV cache up to its length. bytes /
(measured device copy bandwidth) is the fastest a step can be; `bound_fraction` is how close each
backend comes. The whole run keeps to --budget-s (default 230 s): work past it is recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from sampling_check import mean_logprob, sampling_match, standard_error

# graph first: fastest; static last: compiles, may hit the budget. Also graph-hf, graph-plain and NAME@sdpa (see
# Backend).
BACKENDS = ("graph", "generate", "static")
STOP_FRACTION = 0.01  # share of the vocabulary that ends a completion in the sampling check


def load_prompts(tokenizer: Any, data: Path | None, count: int, max_len: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    if data is None:
        lengths = torch.randint(max_len // 3, max_len * 3 // 4 + 1, (count,), generator=generator).tolist()
        return [torch.randint(3, tokenizer.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    texts = [f"Question: {row['question']}\nAnswer step by step." for row in rows]
    ids = [tokenizer(text)["input_ids"][-max_len:] for text in texts]
    return [ids[i % len(ids)] for i in range(count)]


class Backend:
    """One backend's `run(prompts, new_tokens, stop_ids, min_new)` -> completion id lists."""

    def __init__(self, name: str, model: Any, pad_id: int) -> None:
        from grpo_tui.train.decode_copy import DecodeCopy
        from grpo_tui.train.decode_model import fused_blockers
        from grpo_tui.train.generation import StaticDecoder

        self.name, self.model, self.pad_id = name, model, pad_id
        # graph-plain: the captured step without torch.compile (graph compiles it, as the trainer does);
        # graph-hf: transformers' forward on the live weights (the trainer's path with grpo.decode_copy = off);
        # NAME@sdpa[+sdpa]: sdpa held to those kernels (graph@cudnn: the path before the kernel) and/or decode steps
        # on grpo_kernels' kernel (@triton); without @, the trainer's default (DEFAULT_DECODE_ATTENTION).
        base, _, sdpa = name.partition("@")
        use_graph = model.device.type == "cuda"
        sdpa_backends = tuple(sdpa.split("+")) if sdpa else None  # None: the trainer's default
        self.decoder, self.copy_mib, self.decoded = None, None, model
        if base in ("graph", "graph-plain", "graph-hf"):
            compiled = base != "graph-plain" and use_graph
            self.decoder = StaticDecoder(use_graph, compiled, sdpa_backends=sdpa_backends)
            if base != "graph-hf" and not fused_blockers(model):  # as the trainer decodes: on a fused decode copy
                copy = DecodeCopy("keep")
                copy.build(model)
                self.decoded = copy.refresh(model)
                self.copy_mib = copy.nbytes / 2**20

    def run(self, prompts: list[list[int]], new_tokens: int, stop_ids: list[int], ignore_eos: bool) -> list[list[int]]:
        from grpo_tui.train.generation import Sampling, cut_at_eos

        if self.decoder is not None:
            stops = [] if ignore_eos else stop_ids
            return self.decoder.generate(self.decoded, prompts, new_tokens, stops, self.pad_id, Sampling()).ids
        from transformers import GenerationConfig

        # The GenerationConfig TRL builds from GRPOConfig's defaults (see trl GRPOTrainer.__init__).
        config = GenerationConfig(
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens if ignore_eos else 0,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            pad_token_id=self.pad_id,
            eos_token_id=stop_ids,
            cache_implementation="static" if self.name == "static" else None,
            disable_compile=self.name != "static",
        )
        width = max(map(len, prompts))
        device = self.model.device
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return cut_at_eos(out[:, width:].cpu(), stop_ids)

    def release(self) -> None:
        if self.decoder is not None:
            self.decoder.release()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start, repeats = time.perf_counter(), 10
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    return 2 * src.numel() * repeats / (time.perf_counter() - start)


def step_bytes(model: Any, rows: int, mean_context: float) -> float:
    """Bytes one decode step must read: every weight once (tied embeddings once) plus each row's KV cache."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * model.dtype.itemsize
    return weights + rows * mean_context * kv_per_token


def timed_run(
    backend: Backend, prompts: list[list[int]], tokens: int, stop_ids: list[int], device: torch.device, held: int
) -> tuple[list[list[int]], float, float | None]:
    """(completions, seconds, peak MiB above `held`; None off CUDA) of one rollout with EOS ignored."""
    cuda = device.type == "cuda"
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with torch.no_grad():
        out = backend.run(prompts, tokens, stop_ids, ignore_eos=True)
    sync(device)
    seconds = time.perf_counter() - start
    return out, seconds, (torch.cuda.max_memory_allocated() - held) / 2**20 if cuda else None


def measure(
    backend: Backend,
    prompts: list[list[int]],
    new_tokens: int,
    stop_ids: list[int],
    device: torch.device,
    fresh: int = 0,
) -> dict[str, Any]:
    cuda = device.type == "cuda"
    # The previous batch's bucket is freed first, as the trainer frees it after each rollout; left allocated,
    # this call would free it on the way and the peak read against `held` would come out that much too low
    backend.release()
    if cuda:
        torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated() if cuda else 0
    # First call: compile / capture / allocator warm-up; the second is timed. generate compiles nothing, so
    # its first call is 8 tokens; static compiles per cache length, so the others' is the full length. Each
    # call's peak is its own: the first one's includes compiling, the timed one's is the rollout's.
    first = min(8, new_tokens) if backend.name == "generate" else new_tokens
    _, first_s, first_peak = timed_run(backend, prompts, first, stop_ids, device, held)
    out, seconds, peak = timed_run(backend, prompts, new_tokens, stop_ids, device, held)
    tokens = sum(map(len, out))
    assert tokens == len(prompts) * new_tokens, "a completion stopped early"
    # The prefill alone (and one token): graph backends keep their bucket, so this is the rollout's own prefill
    _, prefill_s, _ = timed_run(backend, prompts, 1, stop_ids, device, held)
    row = {
        "first_call_s": round(first_s, 3),
        "s": round(seconds, 3),
        "tokens_per_s": tokens / seconds,
        "prefill_s": round(prefill_s, 4),
        "decode_tokens_per_s": len(prompts) * (new_tokens - 1) / max(seconds - prefill_s, 1e-9),
        "peak_mib": peak,
        "first_call_peak_mib": first_peak,
    }
    if fresh:
        row.update(fresh_rollouts(backend, prompts, new_tokens, device, fresh, held))
    return row


def fresh_rollouts(
    backend: Backend, prompts: list[list[int]], new_tokens: int, device: torch.device, count: int, held: int
) -> dict[str, Any]:
    """`count` rollouts as the trainer runs them: the bucket released before each, and the prompts' first 8, 16,
    ... tokens cut, so each needs a cache length of its own (on CUDA: a new capture and new prefill shapes, as a
    new batch of prompts brings). The timed rollout above reuses its bucket and shapes; these do not."""
    runs = []
    for i in range(1, count + 1):
        backend.release()
        runs.append(timed_run(backend, [p[min(8 * i, len(p) - 1) :] for p in prompts], new_tokens, [], device, held))
    times, peaks = [r[1] for r in runs], [r[2] for r in runs]
    return {
        "fresh_s": [round(t, 3) for t in times],
        "fresh_tokens_per_s": len(prompts) * new_tokens * count / sum(times),
        "fresh_peak_mib": None if None in peaks else max(peaks),
    }


def profile_rollout(
    backend: Backend, prompts: list[list[int]], new_tokens: int, stop_ids: list[int], device: torch.device, out: Path
) -> dict[str, Any]:
    """One more rollout of `prompts` under torch.profiler (after the timed one: nothing left to compile);
    its operator tables go to OUT/profile-<backend>-<rows>.txt, and on CUDA the allocations live at its
    memory peak to OUT/peak-<backend>-<rows>.txt. The bucket is released first, as the trainer releases it
    after each rollout, so this rollout allocates its cache and captures inside the block: the peak file
    accounts for all of a training rollout's memory, not only its transients. Returns the device time by
    kind of kernel (`kernel_kinds`)."""
    from grpo_tui.train.profiling import peak_allocations, profiled

    path = out / f"profile-{backend.name.replace('@', '_at_')}-{len(prompts)}-{new_tokens}.txt"
    out.mkdir(parents=True, exist_ok=True)
    title = f"one rollout, {backend.name}, {len(prompts)} x {new_tokens} tokens"
    peak = out / f"peak-{path.stem.removeprefix('profile-')}.txt"  # CUDA: what is live at the rollout's peak
    backend.release()
    start = time.perf_counter()
    with profiled(path, device.type == "cuda", title) as prof, torch.no_grad():
        with peak_allocations(peak) if device.type == "cuda" else contextlib.nullcontext():
            backend.run(prompts, new_tokens, stop_ids, ignore_eos=True)
        sync(device)
    wall = time.perf_counter() - start
    return {"backend": backend.name, "batch": len(prompts), "new_tokens": new_tokens, **kernel_kinds(prof, wall)}


# Kinds of device kernel in a rollout, the first whose words a kernel's name contains (lower case). Inductor names
# a kernel after the ops fused into it, and the per-layer kernel that feeds our decode attention carries
# "decode_attention" in its name: elementwise is told apart before attention. Sampling comes first, as its fused
# kernels are inductor's too.
KERNEL_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decode attention", ("_split_kernel", "_merge_kernel")),
    ("sampling and log-probs", ("argmax", "exponential", "logsumexp", "amax", "_token_")),
    ("fused elementwise (torch.compile)", ("triton_",)),
    ("prefill attention", ("fmha", "flash", "attention", "sdpa")),
    ("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "splitkreduce", "cublas")),
    ("copies and fills", ("memcpy", "memset", "copy", "fill")),
)


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, words in KERNEL_KINDS if any(w in lower for w in words)), "other")


# Kernels listed by name in a profile's `kernels`, the longest first: enough to see what each kind holds
TOP_KERNELS = 40


def kernel_kinds(prof: Any, wall_s: float) -> dict[str, Any]:
    """Device time per kernel kind over a profiled block (ms, launches), the TOP_KERNELS kernels that took the most
    (name, kind, ms, launches) and how busy the device was: kernels replayed from a CUDA graph show up one by one,
    as any other."""
    from torch.autograd import DeviceType

    names: dict[str, list[float]] = {}  # per kernel name: ms, launches
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            entry = names.setdefault(event.name, [0.0, 0])
            entry[0] += event.time_range.elapsed_us() / 1000
            entry[1] += 1
    kinds: dict[str, list[float]] = {}  # each name sorted into its kind once, not each launch
    for name, (ms, n) in names.items():
        entry = kinds.setdefault(kernel_kind(name), [0.0, 0])
        entry[0] += ms
        entry[1] += n
    busy = sum(ms for ms, _ in kinds.values())
    longest = sorted(names.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    return {
        "wall_ms": round(1000 * wall_s, 1),
        "device_busy_ms": round(busy, 1),
        "kinds": {kind: {"ms": round(ms, 2), "launches": int(n)} for kind, (ms, n) in sorted(kinds.items())},
        "kernels": [
            {"name": name, "kind": kernel_kind(name), "ms": round(ms, 3), "launches": int(n)}
            for name, (ms, n) in longest
        ],
    }


# --blas: torch's own choice, or the library the graph decoder prefers (generation.DECODE_BLAS)
BLAS_LIBRARIES = ("default", "cublas", "cublaslt")


def decode_options(inductor_text: str, attention_text: str, blas: str = "default") -> tuple[list[str], dict[str, int]]:
    """Set what --inductor, --attention and --blas ask for (the graph decoder's compile options, the decode kernel's
    settings, the BLAS library it prefers) and return the first two as the result records them; a one-line
    ValueError for names or values not allowed."""
    import decode_attention_bench

    inductor = [name for name in inductor_text.split(",") if name]
    if inductor:
        import torch._inductor.config as inductor_config

        unknown = [name for name in inductor if not isinstance(getattr(inductor_config, name, None), bool)]
        if unknown:
            raise ValueError(
                f"--inductor: got {', '.join(unknown)!r}; allowed: boolean options of torch._inductor.config"
            )
    attention: dict[str, int] = {}
    for part in filter(None, attention_text.split(";")):
        name, values = decode_attention_bench.parse_part(part, "--attention")
        if len(values) != 1 or name in attention or not 1 <= values[0] <= 4096:
            raise ValueError(
                f"--attention: got {part!r}; allowed: NAME=INT, ';' between, each NAME once, INT 1 to 4096"
            )
        attention[name] = values[0]
    from grpo_tui.train import generation

    generation.DECODE_COMPILE_OPTIONS = dict.fromkeys(inductor, True) if inductor else None
    generation.DECODE_BLAS = None if blas == "default" else blas
    decode_attention_bench.apply(attention)
    return inductor, attention


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny built-in model and small sizes (smoke test)")
    parser.add_argument("--data", type=Path, help="GSM8K-style .jsonl with a 'question' column")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 16,128,512)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 256 (8 with --tiny)")
    parser.add_argument("--samples", type=int, default=None, help="sampling-check completions (default 512)")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: generate, static, graph, graph-hf, graph-plain; graph[-*]@KERNEL[+KERNEL] holds the decode "
        "steps to sdpa kernels (cudnn, flash, efficient, math) or to grpo_kernels' decode kernel (triton)",
    )
    parser.add_argument(
        "--backend-batches",
        action="append",
        default=[],
        metavar="NAME=B,B",
        help="batch sizes for one backend only (e.g. static=128: each shape compiles), repeatable",
    )
    parser.add_argument("--no-sampling", default="", help="comma-separated backends whose sampling check is skipped")
    parser.add_argument("--budget-s", type=float, default=230.0)
    parser.add_argument(
        "--profile-batch",
        type=int,
        default=None,
        metavar="B",
        help="after each backend's timed rollout at batch B, one more under torch.profiler: its operator tables "
        "go to OUT/profile-<backend>-<B>.txt",
    )
    parser.add_argument(
        "--profile-backends", default="", help="comma-separated backends to profile (default: every one)"
    )
    parser.add_argument(
        "--fresh",
        default="0",
        metavar="K",
        help="after each timed rollout, K more as the trainer runs them (bucket released, prompts cut by 8 more "
        "tokens each: a new cache length each time); their tokens/s and peak are reported as fresh_*",
    )
    parser.add_argument(
        "--inductor",
        default="",
        metavar="NAME[,NAME]",
        help="inductor options turned on for the graph decoder's compiled step (e.g. max_autotune,"
        "coordinate_descent_tuning); default none",
    )
    parser.add_argument(
        "--attention",
        default="",
        metavar="NAME=INT[;NAME=INT]",
        help="settings of grpo_kernels' decode attention for every rollout (names as decode_attention_bench.py's "
        "grid: block, stages, warps, target); default the kernel's own",
    )
    parser.add_argument(
        "--blas",
        choices=BLAS_LIBRARIES,
        default="default",
        help="the BLAS library the graph decoder's matrix products prefer (generation.DECODE_BLAS; each library's "
        "heuristics pick their own tiles and K splits for a decode step's small GEMMs); default torch's own",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        inductor, attention = decode_options(args.inductor, args.attention, args.blas)
    except ValueError as error:
        parser.error(str(error))
    if not args.fresh.isdecimal():
        parser.error(f"--fresh: got {args.fresh!r}; allowed: a whole number of rollouts, 0 or more")
    fresh = int(args.fresh)
    began = time.perf_counter()
    device = torch.device(args.device)
    batch_text = args.batches or ("4,8" if args.tiny else "16,128,512")
    if not all(b.strip().isdecimal() and int(b) > 0 for b in batch_text.split(",")):
        parser.error(f"--batches: got {batch_text!r}; allowed: comma-separated positive integers, e.g. 16,128,512")
    batches = [int(b) for b in batch_text.split(",")]
    new_tokens = args.new_tokens or (8 if args.tiny else 256)
    samples = args.samples or (16 if args.tiny else 512)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.tiny:
        from grpo_tui.tasks.tiny import ensure_tiny_model

        path, dtype, model_name = ensure_tiny_model(), torch.float32, "builtin:tiny-qwen3 (fp32)"
    else:
        from grpo_tui.tasks.shapes import build_shaped_model

        path, dtype, model_name = build_shaped_model("qwen3-0.6b-shape"), torch.bfloat16, "qwen3-0.6b-shape (bf16)"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    max_prompt = 16 if args.tiny else 256
    prompts = load_prompts(tokenizer, args.data, max(max(batches), samples), max_prompt)
    vocab = model.config.vocab_size
    stop_ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[: max(1, int(vocab * STOP_FRACTION))]
    bandwidth = copy_bandwidth(device, 64 if args.tiny else 2048)
    with torch.no_grad():  # the default stream's cuBLAS workspace, which a trainer's forwards made long before
        model(input_ids=torch.tensor([prompts[0]], device=device))
    result: dict[str, Any] = {
        "what": "rollout tokens/s per grpo.generation_backend, sampling check, bandwidth bound",
        "command": " ".join(
            ["python", "benchmarks/generation_bench.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "versions": _versions(),
        "model": model_name,
        "prompts": str(args.data) if args.data else "synthetic",
        "new_tokens": new_tokens,
        "inductor_options": inductor,
        "attention_settings": attention,
        "blas": args.blas,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "throughput": [],
        "profiles": [],
        "sampling": [],
        "skipped": [],
    }

    def save() -> None:
        # After every measurement, so that a run stopped by its time limit keeps what it measured
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "generation-bench.json").write_text(json.dumps(result, indent=1) + "\n")

    def over_budget(what: str) -> bool:
        if time.perf_counter() - began > args.budget_s:
            result["skipped"].append(what)
            return True
        return False

    per_backend = {k: [int(b) for b in v.split(",")] for k, v in (item.split("=", 1) for item in args.backend_batches)}
    for name in args.backends.split(","):
        backend = Backend(name, model, pad)
        for rows in per_backend.get(name, batches):
            if over_budget(f"{name} throughput batch {rows}"):
                continue
            batch = prompts[:rows]
            measured = measure(backend, batch, new_tokens, stop_ids.tolist(), device, fresh)
            row = {
                "backend": name,
                "batch": rows,
                "new_tokens": new_tokens,
                **measured,
                "decode_copy_mib": backend.copy_mib,
                # the prompts as this machine's tokenizer cut them: the bound below reads their mean
                "prompt_tokens_mean": sum(map(len, batch)) / rows,
                "prompt_tokens_max": max(map(len, batch)),
            }
            context = sum(map(len, batch)) / rows + new_tokens / 2
            bound = rows / (step_bytes(model, rows, context) / bandwidth)
            row.update(
                bound_tokens_per_s=bound,
                bound_fraction=row["tokens_per_s"] / bound,
                decode_bound_fraction=row["decode_tokens_per_s"] / bound,  # the decode steps alone, prefill left out
            )
            result["throughput"].append(row)
            save()
            print(json.dumps(row), flush=True)
            profiled_here = not args.profile_backends or name in args.profile_backends.split(",")
            if rows == args.profile_batch and profiled_here and not over_budget(f"{name} profile batch {rows}"):
                result["profiles"].append(
                    profile_rollout(backend, batch, new_tokens, stop_ids.tolist(), device, args.out)
                )
                save()
        if name not in args.no_sampling.split(",") and not over_budget(f"{name} sampling check"):
            torch.manual_seed(0)
            start = time.perf_counter()
            with torch.no_grad():
                completions = backend.run(prompts[:samples], new_tokens, stop_ids.tolist(), ignore_eos=False)
            seconds = time.perf_counter() - start
            lengths = [float(len(c)) for c in completions]
            logprob, per_completion = mean_logprob(model, prompts[:samples], completions, pad, 32)
            check = {
                "backend": name,
                "completions": len(completions),
                "s": round(seconds, 3),
                "mean_logprob": logprob,
                "mean_logprob_se": standard_error(per_completion),
                "length_mean": sum(lengths) / len(lengths),
                "length_std": standard_error(lengths) * len(lengths) ** 0.5,
                "length_mean_se": standard_error(lengths),
            }
            result["sampling"].append(check)
            print(json.dumps(check), flush=True)
        backend.release()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["sampling_match"] = sampling_match(result["sampling"])
    result["total_s"] = round(time.perf_counter() - began, 1)
    save()
    print(table(result))
    return 0


def _versions() -> dict[str, str]:
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'backend':9} {'batch':>5} {'new':>5} {'tok/s':>8} {'first s':>8} {'prefill s':>9} {'peak MiB':>9} "
        f"{'bound %':>8} {'steps %':>8} fresh tok/s"
    ]
    for r in result["throughput"]:
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        fresh = f"{r['fresh_tokens_per_s']:.0f}" if "fresh_tokens_per_s" in r else "-"
        lines.append(
            f"{r['backend']:9} {r['batch']:>5} {r['new_tokens']:>5} {r['tokens_per_s']:>8.0f} {r['first_call_s']:>8.1f} "
            f"{r['prefill_s']:>9.3f} {peak:>9} {100 * r['bound_fraction']:>7.1f}% "
            f"{100 * r['decode_bound_fraction']:>7.1f}% {fresh:>11}"
        )
    for p in result.get("profiles", []):
        kinds = ", ".join(f"{kind} {v['ms']:.0f}" for kind, v in p["kinds"].items())
        lines.append(
            f"profile {p['backend']} {p['batch']}x{p['new_tokens']}: wall {p['wall_ms']:.0f} ms, busy "
            f"{p['device_busy_ms']:.0f} ms: {kinds}"
        )
    lines.append(f"{'backend':9} {'n':>5} {'mean logp':>10} {'+-se':>7} {'len mean':>8} {'+-se':>6} {'len std':>8}")
    for s in result["sampling"]:
        lines.append(
            f"{s['backend']:9} {s['completions']:>5} {s['mean_logprob']:>10.4f} {s['mean_logprob_se']:>7.4f} "
            f"{s['length_mean']:>8.1f} {s['length_mean_se']:>6.2f} {s['length_std']:>8.1f}"
        )
    for m in result.get("sampling_match", []):
        lines.append(
            f"{m['backend']} vs {m['against']}: logp z {m['mean_logprob_z']:+.2f}, length z {m['length_mean_z']:+.2f}"
            f" -> {'within' if m['within_spread'] else 'OUTSIDE'} run-to-run spread"
        )
    if result["skipped"]:
        lines.append("skipped (time budget): " + "; ".join(result["skipped"]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
