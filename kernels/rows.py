"""Which rows the GEMMs see: the valid (unmasked) rows of the flattened inputs, cut into chunks.

Padding costs nothing: the chunk loop takes the valid rows only (gathered on the device, by an index that
`torch.nonzero_static` builds without a host sync, since the count is already known on the host from the
call's one sync in `checks.valid_counts`), and scatters per-row outputs back, leaving 0 at skipped rows.
Without padding the chunks are plain slices: no gather, no scatter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Chunk(NamedTuple):
    """One chunk of rows of the flattened `[N, ...]` inputs."""

    rows: slice | torch.Tensor  # a slice (no row skipped), or [n] int64 indices of the valid rows, ascending
    size: int  # n, the number of rows
    seqs: slice | None  # sequence-level sampling: the sequences (rows of the (B, T) inputs) it holds whole


def plan_chunks(
    valid: torch.Tensor | None, n_rows: int, counts: list[int], rows_per_chunk: int, *, whole_sequences: bool
) -> list[Chunk]:
    """Cut the valid rows of `n_rows` flattened rows into chunks of at most `rows_per_chunk` rows.

    Args:
        valid: [n_rows] bool, True where a row counts; None: every row counts.
        n_rows: N = B * T.
        counts: valid rows in total (one int), or per sequence (B ints) with `whole_sequences`, as read from
            the device by `checks.valid_counts`.
        rows_per_chunk: the chunk budget in rows.
        whole_sequences: keep each sequence's valid rows in one chunk (sequence-level importance
            sampling couples them); a sequence longer than the budget gets a chunk of its own.

    Returns:
        The chunks in row order; none for rows that do not count (all padding: no chunk at all).
    """
    n_valid = sum(counts)
    index = None
    if n_valid != n_rows:
        # The count is known here, so this builds the index without another host sync
        index = torch.nonzero_static(valid, size=n_valid).squeeze(1)  # [n_valid]
    spans: list[tuple[int, int, slice | None]] = []  # [start, end) in valid-row order, sequences held whole
    if whole_sequences:
        start = first = total = 0
        for seq, count in enumerate(counts):
            if total and total + count > rows_per_chunk:
                spans.append((start, start + total, slice(first, seq)))
                start, first, total = start + total, seq, 0
            total += count
        if total:
            spans.append((start, start + total, slice(first, len(counts))))
    else:
        spans = [(s, min(s + rows_per_chunk, n_valid), None) for s in range(0, n_valid, rows_per_chunk)]
    return [Chunk(slice(s, e) if index is None else index[s:e], e - s, seqs) for s, e, seqs in spans]


def scatter_rows(dense: torch.Tensor, rows: slice | torch.Tensor, values: torch.Tensor) -> None:
    """dense[rows] = values, for a slice or an index of rows (in place)."""
    if isinstance(rows, slice):
        dense[rows].copy_(values)
    else:
        dense.index_copy_(0, rows, values)
