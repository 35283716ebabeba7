"""Rollout backends (`grpo.generation_backend`) and the static-cache decoder behind `graph`.

    generate  TRL's own path: `model.generate` with a dynamic KV cache (the baseline).
    static    TRL's path with transformers' built-in speed-up: `cache_implementation="static"`, and the decode
              step compiled by transformers (TRL's GRPOConfig sets `disable_compile`; this backend clears it).
              Compiles again for each new batch or prompt length.
    graph     Ours: a static KV cache sized to the rollout (rows rounded up to 8, length exactly prompt width +
              max new tokens); the token step (forward, sampling, the token written; `decode_step`) compiled by
              torch.compile (once per row count: the cache length is a dynamic dimension) and captured as a CUDA
              graph, then replayed for every token. CUDA only.
    auto      graph on CUDA when nothing blocks it (20x generate at 128 x 256 on the H200,
              `benchmarks/results/generation-h200/`), else generate.

After each rollout the bucket (KV cache and graph pool) is released: capturing again costs a few decode steps per
rollout, keeping the cache through the loss phase cost the whole step ~10 GiB of peak (`benchmarks/step_times.py`
over a training run's step records).

The graph reads the parameters of the model it is given: a captured kernel reads a parameter's storage. On
the live weights the optimizer updates that storage in place, so the graph follows them. Under FSDP2, with
LoRA, and wherever our own forward covers the model, the trainer hands it the decode copy instead
(`decode_copy`: full weights, adapters merged, refreshed in place once per rollout); on a copy with fused
projections (`decode_model`) the decoder runs that forward. DeepSpeed and FSDP1 swap the storage between
forwards and fall back to generate.

`StaticDecoder(use_graph=False)` is the eager twin: the same `prefill`/`decode_and_take` without capture. CPU tests
hold it to `model.generate` token for token (greedy, and sampled under one seed); the graph replays what it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from grpo_tui.runs.failures import labelled_failure
from grpo_tui.train.compaction import RowMap, can_compact, head, restore, rows_are_dynamic, snapshot
from grpo_tui.train.decode_attention import (
    DEFAULT_DECODE_ATTENTION,
    TRITON_DECODE,
    attention_context,
    folded_heads,
    sdpa_backend_list,
)
from grpo_tui.train.decode_model import KvCache, fused_model
from grpo_tui.train.decode_step import (
    DecodeState,
    cache_argument,
    decode_and_take,
    kernel_chooses,
    length_is_dynamic,
    prefill,
    take_token,
)
from grpo_tui.train.sampling import Sampling, cut_at_eos, seen_tokens

# Rollouts pad their rows up to this multiple, so nearby batch sizes share one compiled step. The cache length
# is not rounded: every slot is KV cache for all rows (112 KiB per row at Qwen3-0.6B's shape), and rounding it
# up to 128 slots made the graph's rollout peak 6-10% heavier than generate's, whose cache grows to what it needs
# (exact: 2-4% lighter in training runs on the H200, `benchmarks/results/generation-h200/`).
ROW_MULTIPLE = 8
# Decode steps between checks that every row has finished: each check waits for the GPU, so it is rare.
FINISH_CHECK_EVERY = 8
# Eager decode steps on a side stream before capture: lazy allocations and library autotuning happen there.
WARMUP_STEPS = 3
# torch.compile's inductor options for the compiled token step (None: its defaults); benchmarks set it to compare
DECODE_COMPILE_OPTIONS: dict[str, Any] | None = None
# The BLAS library the decoder's matrix products prefer (`torch.backends.cuda.preferred_blas_library`: "cublas",
# "cublaslt"), or None: torch's own. Held around every rollout only, where a captured graph keeps the kernels
# chosen when it was captured. Benchmarks set it to compare: a decode step's GEMMs are a few rows by a few
# thousand columns, far from the memory bandwidth, and each library's heuristics pick their tiles and K splits.
DECODE_BLAS: str | None = None


class Completions(NamedTuple):
    """A rollout's completions, each cut after its first EOS, and the log-prob of each of their tokens."""

    ids: list[list[int]]
    logprobs: list[list[float]]


@contextmanager
def preferred_blas(name: str | None) -> Iterator[None]:
    """torch's matrix products prefer the BLAS library `name` inside the block (None: no change)."""
    if name is None:
        yield
        return
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _halved_rows(rows: int, active: int) -> int:
    """`rows` halved (rounded up to ROW_MULTIPLE) while `active` rows still fit. Every rollout of a bucket then
    compacts along the same few row counts (128, 64, 32, 16, 8), each captured once, whatever its lengths."""
    while (half := _round_up(-(-rows // 2), ROW_MULTIPLE)) < rows and half >= active:
        rows = half
    return rows


class StaticDecoder:
    """Batched sampling with a static KV cache; `use_graph` replays the decode step from a CUDA graph.

    A bucket (rows, cache length) is kept while later rollouts fit in it and sample the same way: its cache
    is reset, not reallocated, and its graph is captured again only when a rollout needs a larger bucket or
    other sampling settings. The graph holds the whole token step (forward, sampling, writing the token), so
    the host only replays it and checks every `FINISH_CHECK_EVERY` steps whether all rows have ended.
    """

    def __init__(
        self,
        use_graph: bool,
        compiled: bool = False,
        on_compile_failure: Callable[[str], None] | None = None,
        on_compile_start: Callable[[int, int], None] | None = None,
        sdpa_backends: tuple[str, ...] | None = None,
        on_kernel_failure: Callable[[str], None] | None = None,
        compact: bool = False,
    ) -> None:
        self.use_graph = use_graph
        # Finished rows stop costing (`compaction`): on the fused forward's cache, once at most half the rows
        # are still decoding, the rest of the rollout decodes only those, on the bucket halved as often as they fit
        # (a graph captured once per halving).
        self.compact = compact
        # The kernels the decode steps may use: "triton" (grpo_kernels' decode kernel, 3.1x cuDNN's sdpa per call
        # on the H200, `benchmarks/results/decode-attention-h200/`) and/or torch's SDPBackend names (empty: torch's
        # choice); None: DEFAULT_DECODE_ATTENTION.
        # Checked here: a one-line ValueError before any rollout.
        self._sdpa = DEFAULT_DECODE_ATTENTION if sdpa_backends is None else tuple(sdpa_backends)
        sdpa_backend_list(self._sdpa)
        # torch.compile's fused kernels for the token step (the graph captures them as they are): ~1.5x the
        # tokens/s of the plain graph on the H200 (`benchmarks/generation_bench.py`), for ~35 s of compiling per
        # row count and process.
        self.compiled = compiled
        self._take = (
            torch.compile(decode_and_take, dynamic=False, options=DECODE_COMPILE_OPTIONS)
            if compiled
            else decode_and_take
        )
        self._on_compile_failure, self._on_kernel_failure = on_compile_failure, on_kernel_failure
        self._on_compile_start = on_compile_start  # (rows, length): a row count compiled for the first time
        self._compiled_shapes: set[tuple] = set()
        self.state: DecodeState | None = None
        self.captures = 0  # graphs captured so far (tests and the benchmark read it)
        self.row_counts: list[int] = []  # the last rollout's rows per stretch of decode steps (compaction shrinks them)
        self.positions = 0  # token positions the last rollout computed: its prefill's and every decode step's rows
        self._model_id: int | None = None
        self._graphs: dict[int, Any] = {}  # rows -> the graph captured on the bucket's first rows
        # (Sampling, eos ids, pad id, lengths forced) the bucket's graph samples with
        self._recipe: tuple | None = None
        # The stream of every warm-up and capture: each new stream gets its own cuBLAS workspace, kept for the
        # life of the process, and a fresh one per rollout would add one per capture (up to torch's pool of 32).
        self._stream: Any = None
        self._dtype = torch.float32

    def generate(
        self,
        model: Any,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        eos_ids: list[int],
        pad_id: int,
        sampling: Sampling,
        lengths: list[int] | None = None,
    ) -> Completions:
        """Completion ids per prompt, each cut after its first EOS (TRL's `_generate_single_turn` contract), with
        their tokens' log-probs. `lengths` (forced completion lengths, `tasks.workload`): row i emits EOS as its
        lengths[i]-th token at the latest.
        If a rollout fails on grpo_kernels' decode kernel (e.g. a GPU it does not compile for), it runs again on
        sdpa, which later rollouts keep, after a one-line reason to `on_kernel_failure`; out of memory is raised."""
        # Outside the retry: a library torch refuses is not the decode kernel failing
        with preferred_blas(DECODE_BLAS):
            while True:
                try:
                    with folded_heads(model), attention_context(self._sdpa):  # captured with them: replays keep them
                        return self._generate(model, prompt_ids, max_new_tokens, eos_ids, pad_id, sampling, lengths)
                except Exception as exc:
                    if TRITON_DECODE not in self._sdpa or isinstance(exc, torch.OutOfMemoryError):
                        raise
                    self._sdpa = tuple(name for name in self._sdpa if name != TRITON_DECODE)
                    self.release()
                    if self._on_kernel_failure is not None:
                        self._on_kernel_failure(labelled_failure("decode attention kernel failed", exc))

    def _generate(self, model, prompt_ids, max_new_tokens, eos_ids, pad_id, sampling, lengths) -> Completions:
        device = next(model.parameters()).device
        count, width = len(prompt_ids), max(len(p) for p in prompt_ids)
        self._fit(model, count, width + max_new_tokens, device, (sampling, tuple(eos_ids), pad_id, lengths is not None))
        state = self.state
        if lengths is not None:
            state.stop_after.fill_(max_new_tokens + 1)
            state.stop_after[:count] = torch.tensor(lengths, device=device)
        ids = torch.full((state.rows, width), pad_id, dtype=torch.long)
        mask = torch.zeros((state.rows, width), dtype=torch.bool)
        for row, prompt in enumerate(prompt_ids):  # left padding, as TRL pads for generate
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = True
        ids, mask = ids.to(device), mask.to(device)

        # Reset in place: the graph keeps pointing at the same storage.
        state.cache.reset()
        state.out.fill_(pad_id)
        state.logps.zero_()
        state.step.zero_()
        if state.seed is not None:  # from torch's generator: torch.manual_seed makes a rollout repeatable
            state.seed.fill_(int(torch.randint(0, 2**62, ())))
        # The bucket's filler rows are done from the start.
        state.finished.copy_(torch.arange(state.rows, device=device) >= count)
        if state.seen is not None:
            state.seen.copy_(seen_tokens(ids.masked_fill(~mask, -1), state.seen.size(1) - 1))
        take_token(state, prefill(model, state, ids, mask, self._dtype))
        rows = RowMap(count, state) if self.compact and can_compact(state) else None
        view, steps = state, max_new_tokens
        self.row_counts = [state.rows]
        # What the prefill computed: the prompts' real tokens on a fused copy (packed), else padded to the widest
        self.positions = sum(map(len, prompt_ids)) if state.fused is not None else count * width
        for taken in range(1, max_new_tokens + 1):
            if taken == max_new_tokens:
                break
            if taken % FINISH_CHECK_EVERY == 0:
                active = int((~view.finished).sum())  # waits for the GPU: hence only every few steps
                if active == 0:
                    steps = taken
                    break
                smaller = _halved_rows(view.rows, active)
                # The capture's warm-up steps write a few slots ahead: not within that many of the end.
                room = max_new_tokens - taken > WARMUP_STEPS + FINISH_CHECK_EVERY
                if rows is not None and room and smaller < view.rows:
                    rows.compact(view, smaller)
                    view = self._view(model, smaller)
                    self.row_counts.append(smaller)
            self._step(model, view)
            self.positions += view.rows
        if rows is None:
            out, logps = state.out[:count, :steps], state.logps[:count, :steps]
        else:
            rows.keep(view, torch.arange(view.rows, device=device))
            out, logps = rows.out[:, :steps], rows.logps[:, :steps]
        ids = cut_at_eos(out.cpu(), eos_ids)
        logps = logps.cpu().tolist()
        return Completions(ids, [row[: len(completion)] for row, completion in zip(logps, ids)])

    def _step(self, model: Any, view: DecodeState) -> None:
        graph = self._graphs.get(view.rows)
        if graph is None:
            self._take(model, view, self._dtype)
        else:
            graph.replay()

    def _view(self, model: Any, rows: int) -> DecodeState:
        """The bucket's first `rows` rows, with a graph captured for them if the bucket replays graphs (kept with
        the bucket). The capture's warm-up steps run on the rollout's own tensors: what they change is restored."""
        view = head(self.state, rows)
        if self.compiled:
            length_is_dynamic(view)
            rows_are_dynamic(view)
        if self.use_graph and rows not in self._graphs and self.state.rows in self._graphs:
            saved = snapshot(view)
            self._capture(model, view)
            restore(view, saved)
        return view

    def _fit(self, model: Any, rows: int, length: int, device: torch.device, recipe: tuple) -> None:
        state = self.state
        if (
            state is not None
            and self._model_id == id(model)
            and self._recipe == recipe
            and state.rows >= rows
            and state.length >= length
        ):
            return
        from transformers import StaticCache

        self.release()
        sampling, eos_ids, pad_id, forced = recipe
        # Room for the one-token prefill below and the warm-up steps before a capture
        rows, length = _round_up(rows, ROW_MULTIPLE), max(length, WARMUP_STEPS + 2)
        config = model.config
        self._dtype = next(model.parameters()).dtype
        fused = fused_model(model)
        self.state = state = DecodeState(
            cache=(
                StaticCache(config=config, max_cache_len=length)
                if fused is None
                else KvCache.allocate(fused, rows, length, device)
            ),
            tokens=torch.zeros((rows, 1), dtype=torch.long, device=device),
            positions=torch.zeros((rows, 1), dtype=torch.long, device=device),
            cache_index=torch.zeros((), dtype=torch.long, device=device),
            key_valid=torch.ones((rows, length), dtype=torch.bool, device=device),
            key_index=torch.arange(length, device=device),
            additive_mask=config._attn_implementation == "eager",
            cache_argument=cache_argument(model),
            sampling=sampling,
            pad_id=pad_id,
            eos=torch.tensor(eos_ids, dtype=torch.long, device=device).reshape(-1),
            out=torch.full((rows, length), pad_id, dtype=torch.long, device=device),
            finished=torch.zeros(rows, dtype=torch.bool, device=device),
            step=torch.zeros(1, dtype=torch.long, device=device),
            logps=torch.zeros((rows, length), dtype=torch.float32, device=device),
            fused=fused,
        )
        self._model_id, self._recipe = id(model), recipe
        if fused is None:
            # StaticCache allocates its layers on the first write: a one-token prefill does it before any capture.
            one = torch.ones((rows, 1), dtype=torch.bool, device=device)
            vocab = prefill(model, state, state.tokens, one, self._dtype).size(-1)
        else:
            vocab = fused.lm_head.size(0)
        if forced:
            state.stop_after = torch.zeros(rows, dtype=torch.long, device=device)
        if kernel_chooses(sampling, device):
            state.seed = torch.zeros(1, dtype=torch.long, device=device)
        if sampling.repetition_penalty != 1.0:
            state.seen = torch.zeros((rows, vocab + 1), dtype=torch.bool, device=device)
        if self.compiled:
            length_is_dynamic(state)
        if self.use_graph:
            shape = (rows, recipe)
            if self.compiled and shape not in self._compiled_shapes and self._on_compile_start is not None:
                self._on_compile_start(rows, length)
            self._compiled_shapes.add(shape)
            self._capture(model, state)

    def _warm_up(self, model: Any, state: DecodeState) -> None:
        for _ in range(WARMUP_STEPS):
            self._take(model, state, self._dtype)

    def _compiled_or_plain(self, build: Callable[[], Any]) -> Any:
        """`build()` with the compiled step; if that fails, with the plain step (torch.compile's errors, also those
        of capturing compiled code, have no common base), after a one-line reason to `on_compile_failure`."""
        try:
            return build()
        except Exception as exc:
            if not self.compiled:
                raise
            self.compiled, self._take = False, decode_and_take
            if self._on_compile_failure is not None:
                self._on_compile_failure(labelled_failure("torch.compile failed", exc))
            return build()

    def _captured(self, model: Any, state: DecodeState) -> Any:
        """Warm-up steps on a side stream (lazy allocations, autotuning, compiling), then the captured step."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._warm_up(model, state)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            self._take(model, state, self._dtype)
        return graph

    def _capture(self, model: Any, state: DecodeState) -> None:
        self._graphs[state.rows] = self._compiled_or_plain(lambda: self._captured(model, state))
        self.captures += 1

    def release(self) -> None:
        """Drop the cache and graphs (their memory goes back to the allocator)."""
        self.state, self._graphs, self._model_id, self._recipe = None, {}, None, None
