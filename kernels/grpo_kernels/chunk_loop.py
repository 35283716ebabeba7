"""The chunk loop behind `functional`: per chunk of valid rows, logits -> (scoring) row stats, or (loss) the
unnormalised softmax in place with its stats -> dW/db/dH, with the gradient formed in the forward pass (see
`functional`'s docstring for the stages and `probs` for the one-pass softmax)."""

from __future__ import annotations

import torch

from . import probs, triton_ops
from .casts import scale_rows
from .rows import gather_valid, scatter_rows

# `torch.addmm(..., out_dtype=torch.float32)` from bf16/fp16 inputs exists from torch 2.8 on CUDA
_HAS_OUT_DTYPE = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


def addmm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool = False) -> None:
    """acc += a @ b, or acc = a @ b when `first` (acc's old values never read: no zero-fill before the loop).

    For an fp32 acc and bf16/fp16 operands the product is not rounded to bf16 first: rounding each chunk's
    partial dW before the sum biases training (TRL's fused head notes the same).
    """
    kw = {}
    if acc.dtype != a.dtype:
        if _HAS_OUT_DTYPE and acc.is_cuda:
            kw["out_dtype"] = acc.dtype  # cuBLAS accumulates in fp32 and writes fp32: no rounding in between
        else:
            a, b = a.to(acc.dtype), b.to(acc.dtype)
    if first:
        torch.mm(a, b, out=acc, **kw)
    else:
        torch.addmm(acc, a, b, out=acc, **kw)


def chunk_loop(hidden2d, weight, bias, ids, chunks, *, inv_t, token_grad, seq_grad, want, lean):
    """Run the chunks; returns (logps, entropies, grad_hidden, grad_weight, grad_bias), all over N rows.

    grad_weight and grad_bias come back in their accumulators' dtypes (fp32 for bf16/fp16 weights unless
    lean): the loss's backward writes them, scaled by grad_output, into the leaves' dtypes in one pass, long
    after this frame and every view of the chunk buffers are gone, so the weight-sized result never coexists
    with the [C, V] buffer.

    hidden2d: [N, H]; ids: [N]; chunks: from `rows.plan_chunks`. Rows in no chunk are skipped: their
    log-prob and entropy stay 0 and their rows of grad_hidden exactly 0.
    token_grad: a callable returning the dict of [N] tensors and scalars for `triton_ops.finish_rows`
        (token-level sampling), called once the first chunk's GEMM and pass are queued, so that the host's
        work on those per-token terms overlaps the device's;
    seq_grad: callable (chunk, [n] logps) -> [n] d(loss)/d(logps) (sequence level); both None: no gradient.
    Per-row inputs are gathered and per-row outputs scattered once per call (`rows.gather_valid`): the
    chunks index them by `Chunk.span`.
    """
    n_rows, width = hidden2d.shape
    vocab = weight.shape[0]
    dev = hidden2d.device
    stats_dtype = torch.float64 if hidden2d.dtype == torch.float64 else torch.float32
    n_valid = sum(c.size for c in chunks)
    skipping = n_valid != n_rows  # rows in no chunk keep 0 in every dense output
    index = chunks[0].index if chunks else None  # the valid rows when some are skipped (None: every row, or none)
    # The log-probs and entropies in valid-row order: without an index the dense outputs themselves (zeros when
    # every row is masked: no chunk writes them); with one, the zero-filled dense ones are made after the loop,
    # not among the launches that precede the first GEMM
    if index is None:
        lp_v, ent_v = (torch.zeros if skipping else torch.empty)((2, n_rows), device=dev, dtype=stats_dtype)
    else:
        lp_v, ent_v = torch.empty((2, n_valid), device=dev, dtype=stats_dtype)
    chunk_rows = max((c.size for c in chunks), default=0)
    if not any(want):
        token_grad = seq_grad = None
    # The loss's chunks read their logits once (`probs`); scoring (no gradient) needs the statistics only
    one_pass = token_grad is not None or seq_grad is not None
    ids_v = gather_valid(ids, index)
    buf = torch.empty((chunk_rows, vocab), device=dev, dtype=hidden2d.dtype)
    # A gathering chunk's hidden rows, contiguous for the GEMMs (one buffer for every chunk)
    hbuf = None if index is None else torch.empty((chunk_rows, width), device=dev, dtype=hidden2d.dtype)
    # c * h_c for the dW GEMM (fp16 scales the tile instead), and the rows `probs_pass` must repair (zeros; left
    # zero by each pass)
    scales_h = one_pass and want[1] and hidden2d.dtype != torch.float16
    sbuf = torch.empty((chunk_rows, width), device=dev, dtype=hidden2d.dtype) if scales_h else None
    bad = torch.zeros((chunk_rows,), device=dev, dtype=torch.int32) if one_pass else None
    # dH: into its rows of the dense gradient, or, rows being skipped, in valid-row order first (the dense one,
    # padding included, is allocated and filled only after the chunk buffer is freed: at 75% padding it is 4x the
    # valid rows' size)
    gh = gh_v = None
    if want[0] and index is not None:
        gh_v = hidden2d.new_empty((n_valid, width))
    elif want[0]:
        gh = (torch.zeros_like if skipping else torch.empty_like)(hidden2d)
    acc_dtype = weight.dtype if (lean or weight.dtype in (torch.float32, torch.float64)) else torch.float32
    # Set by the first chunk's dW GEMM (zeroed after the loop if no chunk ran)
    gw = torch.empty(weight.shape, device=weight.device, dtype=acc_dtype) if want[1] else None
    gb = torch.zeros((vocab,), device=weight.device, dtype=stats_dtype) if want[2] else None
    # Scoring: every chunk's row statistics in one pair of buffers, one `finish_rows` launch per call (a 4k-token
    # scoring call is host-bound: each launch saved counts)
    stats = None if one_pass else triton_ops.stats_buffers(n_valid, vocab, hidden2d.dtype, dev)
    w_t = weight.t()
    row_terms = None  # token_grad's per-row inputs, gathered into valid-row order once
    for i, chunk in enumerate(chunks):
        tile = buf[: chunk.size]  # [n, V]
        rows = chunk.rows  # a slice, or a view of the index
        gathered = not isinstance(rows, slice)
        if gathered:
            h_c = torch.index_select(hidden2d, 0, rows, out=hbuf[: chunk.size])  # [n, H]
        else:
            h_c = hidden2d[rows]  # [n, H], a view
        ids_c = ids_v[chunk.span]  # [n]
        if bias is None:
            torch.mm(h_c, w_t, out=tile)
        else:
            torch.addmm(bias, h_c, w_t, out=tile)
        if one_pass:  # tile = exp(z - M) (target column: the raw logit until finish_rows writes exp(z_t - M) - S)
            parts, target_logit, shift = probs.probs_pass(tile, ids_c, inv_t, bad)
            fix = (tile, ids_c, shift, -inv_t)
        else:  # scoring: the statistics only, finished for every row at once after the loop
            triton_ops.row_stats(tile, ids_c, inv_t, out=(stats[0][:, chunk.span], stats[1][chunk.span]))
            continue
        chunk_grad = None
        if token_grad is not None:
            if row_terms is None:  # asked for once the first chunk's GEMM and pass are queued (see the docstring)
                row_terms = {
                    k: (gather_valid(v, index) if isinstance(v, torch.Tensor) else v) for k, v in token_grad().items()
                }
            chunk_grad = {k: (v[chunk.span] if isinstance(v, torch.Tensor) else v) for k, v in row_terms.items()}
        out = (lp_v[chunk.span], ent_v[chunk.span])
        lp, _, _, _ = triton_ops.finish_rows(parts, target_logit, chunk_grad, out=out, fix=fix)
        coef = shift  # [n]: c = -g / (T S) at token level; 1 / S, to scale here, at sequence level
        if seq_grad is not None:
            coef = coef * seq_grad(chunk, lp) * -inv_t
        # d(loss)/d(logits) = c * tile: a per-row scale, applied to the [n, H] side of each GEMM
        if tile.dtype == torch.float16:  # c * h_c and tile @ W would leave fp16's range: the tile takes c
            tile.mul_(coef.unsqueeze(1))
            coef = None
        if gw is not None:
            ch = h_c if coef is None else scale_rows(h_c, coef, sbuf[: chunk.size])
            addmm_acc(gw, tile.t(), ch, first=i == 0)
        if gb is not None:
            gb += tile.sum(0, dtype=gb.dtype) if coef is None else torch.mv(tile.t(), coef.to(tile.dtype))
        if want[0]:
            dh = torch.mm(tile, weight, out=gh_v[chunk.span] if gathered else gh[rows])  # [n, H]
            if coef is not None:
                scale_rows(dh, coef, dh)
    if stats is not None and chunks:
        triton_ops.finish_rows(*stats, out=(lp_v, ent_v))
    if gw is not None and not chunks:
        gw.zero_()  # every row masked: no chunk set it
    if gh_v is not None:
        del buf, tile, fix  # the chunk buffer and its views: freed before the dense dH exists
        gh = torch.zeros_like(hidden2d)
        scatter_rows(gh, index, gh_v)
        del gh_v
    logps, entropies = lp_v, ent_v
    if index is not None:
        logps, entropies = torch.zeros((2, n_rows), device=dev, dtype=stats_dtype)
        scatter_rows(logps, index, lp_v)
        scatter_rows(entropies, index, ent_v)
    return logps, entropies, gh, gw, gb
