"""Rollout backends (`grpo.generation_backend`) and the static-cache decoder behind `graph`.

    generate  TRL's own path: `model.generate` with a dynamic KV cache (the baseline).
    static    TRL's path with transformers' built-in speed-up: `cache_implementation="static"`, and the decode
              step compiled by transformers (TRL's GRPOConfig sets `disable_compile`; this backend clears it).
              Compiles again for each new batch or prompt length.
    graph     Ours: a static KV cache sized to the rollout (rows rounded up to 8, length exactly prompt width +
              max new tokens); the token step (forward, sampling, the token written) compiled by torch.compile
              (once per row count: the cache length is a dynamic dimension) and captured as a CUDA graph, then
              replayed for every token. CUDA only.
    auto      graph on CUDA when nothing blocks it (20x generate at 128 x 256 on the H200), else generate.

After each rollout the bucket (KV cache and graph pool) is released: capturing again costs a few decode steps per
rollout, keeping the cache through the loss phase cost the whole step ~10 GiB of peak.

The graph reads the parameters of the model it is given: a captured kernel reads a parameter's storage. On
the live weights the optimizer updates that storage in place, so the graph follows them. Under FSDP2, and
with LoRA, the trainer hands it the decode copy instead (`decode_copy`: full weights, adapters merged, refreshed
in place once per rollout). DeepSpeed and FSDP1 swap the storage between forwards and fall back to generate.

`StaticDecoder(use_graph=False)` is the eager twin: the same `prefill`/`decode_and_take` without capture. CPU tests
hold it to `model.generate` token for token (greedy, and sampled under one seed); the graph replays what it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from grpo_tui.runs.failures import labelled_failure
from grpo_tui.train.decode_attention import (
    DEFAULT_DECODE_ATTENTION,
    TRITON_DECODE,
    attention_context,
    folded_heads,
    sdpa_backend_list,
)
from grpo_tui.train.sampling import Sampling, choose_tokens, cut_at_eos, seen_tokens

# Rollouts pad their rows up to this multiple, so nearby batch sizes share one compiled step. The cache length
# is not rounded: every slot is KV cache for all rows (112 KiB per row at Qwen3-0.6B's shape), and rounding it
# up to 128 slots made the graph's rollout peak 6-10% heavier than generate's, whose cache grows to what it needs
# (exact: 2-4% lighter in training runs on the H200, benchmarks/results/h200-2026-12-03d/).
ROW_MULTIPLE = 8
# Prompt tokens per prefill forward (rows x columns), at least PREFILL_MIN_COLUMNS columns. The prefill's
# activations (~53 KiB a token on the H200) scale with it and come on top of the full static cache, where
# generate's prefill runs beside a prompt-sized one: one forward of 16 x 128 tokens put the graph's rollout peak
# above generate's. But each forward is ~1,700 eager kernel launches (~25 ms of host time): 1,024-token chunks
# at 128 rows (32 forwards) made a 128 x 256 rollout 0.7 s slower, 32-column chunks (8) 0.25 s. 64 columns
# (4 forwards for 256-token prompts) stay below the ~8 KiB a row and slot that generate's repeat_kv copies.
PREFILL_TOKENS = 1024
PREFILL_MIN_COLUMNS = 64
# Decode steps between checks that every row has finished: each check waits for the GPU, so it is rare.
FINISH_CHECK_EVERY = 8
# Eager decode steps on a side stream before capture: lazy allocations and library autotuning happen there.
WARMUP_STEPS = 3


@dataclass
class DecodeState:
    """The static tensors one bucket's decode step reads and writes; their storage never moves."""

    cache: Any  # transformers StaticCache, max_cache_len = length
    tokens: torch.Tensor  # [R, 1] the token each row feeds next
    positions: torch.Tensor  # [R, 1] its rotary position
    cache_index: torch.Tensor  # [] the cache slot the step writes (the same for every row: prompts are left-padded)
    key_valid: torch.Tensor  # [R, L] False on prompt padding
    key_index: torch.Tensor  # [L] 0..L-1
    additive_mask: bool  # eager attention adds the mask; sdpa takes it as bool
    cache_argument: str  # the forward's keyword for the cache (see `cache_argument`)
    # The token choice, captured with the forward: what it samples with and where it writes.
    sampling: Sampling
    pad_id: int
    eos: torch.Tensor  # [E] the ids that end a row
    out: torch.Tensor  # [R, L] the tokens chosen so far (pad once a row finished)
    finished: torch.Tensor  # [R] rows past their EOS (and the bucket's filler rows)
    step: torch.Tensor  # [1] the column of `out` the next token goes to
    logps: torch.Tensor  # [R, L] fp32 log-prob of each chosen token under the decode weights (0 after a row ends)
    seen: torch.Tensor | None = None  # [R, V + 1] `seen_tokens` of prompt and output, for the repetition penalty

    @property
    def rows(self) -> int:
        return self.tokens.size(0)

    @property
    def length(self) -> int:
        return self.key_index.numel()


def _attention_mask(state: DecodeState, allowed: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    # A prepared mask mapping skips transformers' own mask building (host logic a graph cannot replay).
    if state.additive_mask:
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    return {"full_attention": allowed}


def cache_argument(model: Any) -> str:
    """The name the model's forward takes its KV cache under: `cache` from transformers ~5.2x on,
    `past_key_values` before (5.17 on the GPU image). An unknown name is swallowed by `**kwargs` and the
    model silently builds a fresh one-token cache each call, so this is read from the base model's signature.
    """
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT's forward is **kwargs
    names = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in names else "past_key_values"


def _forward(model: Any, state: DecodeState, ids: torch.Tensor, positions: torch.Tensor, mask: dict) -> torch.Tensor:
    cache = {state.cache_argument: state.cache}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **cache)
    return out.logits[:, -1].float()  # [R, V], as generate scores in fp32


def prefill_columns(rows: int) -> int:
    """Prompt columns per prefill forward for `rows` rows (see PREFILL_TOKENS)."""
    return max(PREFILL_MIN_COLUMNS, PREFILL_TOKENS // max(rows, 1))


def prefill(model: Any, state: DecodeState, ids: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Write the left-padded prompts ids/mask [R, P] into the reset cache, `prefill_columns` columns per forward
    (the cache advances its write position by each forward's width); the logits [R, V] after the prompts."""
    width = ids.size(1)
    state.key_valid.fill_(True)
    state.key_valid[:, :width] = mask
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    step = prefill_columns(ids.size(0))
    for start in range(0, width, step):
        query = torch.arange(start, min(start + step, width), device=ids.device)[:, None]  # [c, 1]
        causal = state.key_index[None, :] <= query  # [c, L]
        # A padding query sees itself, so no row is fully masked (sdpa would return NaN into the cache).
        allowed = (causal & state.key_valid[:, None, :]) | (state.key_index[None, :] == query)  # [R, c, L]
        columns = slice(start, start + step)
        mask_map = _attention_mask(state, allowed[:, None], dtype)
        logits = _forward(model, state, ids[:, columns], positions[:, columns], mask_map)
    state.positions.copy_(positions[:, -1:] + 1)
    state.cache_index.fill_(width)
    return logits


class Completions(NamedTuple):
    """A rollout's completions, each cut after its first EOS, and the log-prob of each of their tokens."""

    ids: list[list[int]]
    logprobs: list[list[float]]


def token_logps(logits: torch.Tensor, token: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at `token` per row [R]: what the training forward scores the token with
    (TRL divides by the temperature and applies no other warper), so the two are comparable."""
    scaled = logits / temperature if temperature != 1.0 else logits
    return scaled.gather(1, token[:, None])[:, 0] - torch.logsumexp(scaled, -1)


def take_token(state: DecodeState, logits: torch.Tensor) -> None:
    """Choose each row's next token from `logits` [R, V], write it to `out` and `tokens` (its log-prob to `logps`),
    and mark rows that ended."""
    token = choose_tokens(logits, state.sampling, state.seen)
    token = torch.where(state.finished, state.pad_id, token)  # finished rows emit pad
    logp = token_logps(logits, token, state.sampling.temperature).masked_fill(state.finished, 0.0)
    state.out.index_copy_(1, state.step, token[:, None])
    state.logps.index_copy_(1, state.step, logp[:, None])
    state.finished |= (token[:, None] == state.eos).any(-1)
    if state.seen is not None:
        state.seen.scatter_(1, token[:, None], True)
    state.step.add_(1)
    state.tokens.copy_(token[:, None])


def decode_and_take(model: Any, state: DecodeState, dtype: torch.dtype) -> None:
    """The step the graph captures: the forward of every row's last token, then the choice of the next."""
    take_token(state, decode_step(model, state, dtype))


def decode_step(model: Any, state: DecodeState, dtype: torch.dtype) -> torch.Tensor:
    """One token for every row: feeds `state.tokens`, returns the next logits [R, V]."""
    allowed = state.key_valid & (state.key_index <= state.cache_index)  # [R, L]
    logits = _forward(
        model, state, state.tokens, state.positions, _attention_mask(state, allowed[:, None, None], dtype)
    )
    state.positions.add_(1)
    state.cache_index.add_(1)
    return logits


def length_is_dynamic(state: DecodeState) -> None:
    """Mark the cache-length dimension of the step's tensors dynamic for torch.compile: one compiled step then
    serves every cache length (each new exact length would otherwise compile again, ~35 s on the H200)."""
    mark = torch._dynamo.maybe_mark_dynamic
    mark(state.key_valid, 1)
    mark(state.key_index, 0)
    mark(state.out, 1)
    mark(state.logps, 1)
    for layer in getattr(state.cache, "layers", ()):  # transformers' StaticLayer: keys/values [R, H, L, D]
        for name in ("keys", "values"):
            if isinstance(getattr(layer, name, None), torch.Tensor):
                mark(getattr(layer, name), 2)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


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
    ) -> None:
        self.use_graph = use_graph
        # The kernels the decode steps may use: "triton" (grpo_kernels' decode kernel, 2.2x cuDNN's sdpa on the
        # H200) and/or torch's SDPBackend names (empty: torch's choice); None: DEFAULT_DECODE_ATTENTION.
        # Checked here: a one-line ValueError before any rollout.
        self._sdpa = DEFAULT_DECODE_ATTENTION if sdpa_backends is None else tuple(sdpa_backends)
        sdpa_backend_list(self._sdpa)
        # torch.compile's fused kernels for the token step (the graph captures them as they are): ~1.5x the
        # tokens/s of the plain graph on the H200, for ~35 s of compiling per row count and process.
        self.compiled = compiled
        self._take = torch.compile(decode_and_take, dynamic=False) if compiled else decode_and_take
        self._on_compile_failure, self._on_kernel_failure = on_compile_failure, on_kernel_failure
        self._on_compile_start = on_compile_start  # (rows, length): a row count compiled for the first time
        self._compiled_shapes: set[tuple] = set()
        self.state: DecodeState | None = None
        self.captures = 0  # graphs captured so far (tests and the benchmark read it)
        self._model_id: int | None = None
        self._graph: Any = None
        self._recipe: tuple | None = None  # (Sampling, eos ids, pad id) the bucket's graph samples with
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
    ) -> Completions:
        """Completion ids per prompt, each cut after its first EOS (TRL's `_generate_single_turn` contract), with
        their tokens' log-probs.
        If a rollout fails on grpo_kernels' decode kernel (e.g. a GPU it does not compile for), it runs again on
        sdpa, which later rollouts keep, after a one-line reason to `on_kernel_failure`; out of memory is raised."""
        while True:
            try:
                with folded_heads(model), attention_context(self._sdpa):  # captured with them, so replays keep them
                    return self._generate(model, prompt_ids, max_new_tokens, eos_ids, pad_id, sampling)
            except Exception as exc:
                if TRITON_DECODE not in self._sdpa or isinstance(exc, torch.OutOfMemoryError):
                    raise
                self._sdpa = tuple(name for name in self._sdpa if name != TRITON_DECODE)
                self.release()
                if self._on_kernel_failure is not None:
                    self._on_kernel_failure(labelled_failure("decode attention kernel failed", exc))

    def _generate(self, model, prompt_ids, max_new_tokens, eos_ids, pad_id, sampling) -> Completions:
        device = next(model.parameters()).device
        count, width = len(prompt_ids), max(len(p) for p in prompt_ids)
        self._fit(model, count, width + max_new_tokens, device, (sampling, tuple(eos_ids), pad_id))
        state = self.state
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
        # The bucket's filler rows are done from the start.
        state.finished.copy_(torch.arange(state.rows, device=device) >= count)
        if state.seen is not None:
            state.seen.copy_(seen_tokens(ids.masked_fill(~mask, -1), state.seen.size(1) - 1))
        take_token(state, prefill(model, state, ids, mask, self._dtype))
        steps = max_new_tokens
        for taken in range(1, max_new_tokens + 1):
            if taken == max_new_tokens or (taken % FINISH_CHECK_EVERY == 0 and bool(state.finished.all())):
                steps = taken
                break
            self._step(model)
        ids = cut_at_eos(state.out[:count, :steps].cpu(), eos_ids)
        logps = state.logps[:count, :steps].cpu().tolist()
        return Completions(ids, [row[: len(completion)] for row, completion in zip(logps, ids)])

    def _step(self, model: Any) -> None:
        if self._graph is None:
            self._take(model, self.state, self._dtype)
        else:
            self._graph.replay()

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
        sampling, eos_ids, pad_id = recipe
        # Room for the one-token prefill below and the warm-up steps before a capture
        rows, length = _round_up(rows, ROW_MULTIPLE), max(length, WARMUP_STEPS + 2)
        config = model.config
        self._dtype = next(model.parameters()).dtype
        self.state = state = DecodeState(
            cache=StaticCache(config=config, max_cache_len=length),
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
        )
        self._model_id, self._recipe = id(model), recipe
        # StaticCache allocates its layers on the first write: a one-token prefill does it before any capture.
        one = torch.ones((rows, 1), dtype=torch.bool, device=device)
        logits = prefill(model, state, state.tokens, one, self._dtype)
        if sampling.repetition_penalty != 1.0:
            state.seen = torch.zeros((rows, logits.size(-1) + 1), dtype=torch.bool, device=device)
        if self.compiled:
            length_is_dynamic(state)
        if self.use_graph:
            shape = (rows, recipe)
            if self.compiled and shape not in self._compiled_shapes and self._on_compile_start is not None:
                self._on_compile_start(rows, length)
            self._compiled_shapes.add(shape)
            self._capture(model)

    def _warm_up(self, model: Any) -> None:
        for _ in range(WARMUP_STEPS):
            self._take(model, self.state, self._dtype)

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

    def _captured(self, model: Any) -> Any:
        """Warm-up steps on a side stream (lazy allocations, autotuning, compiling), then the captured step."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._warm_up(model)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            self._take(model, self.state, self._dtype)
        return graph

    def _capture(self, model: Any) -> None:
        self._graph = self._compiled_or_plain(lambda: self._captured(model))
        self.captures += 1

    def release(self) -> None:
        """Drop the cache and graph (their memory goes back to the allocator)."""
        self.state, self._graph, self._model_id, self._recipe = None, None, None, None
