"""Which rows the GEMMs see: the valid (unmasked) rows of the flattened inputs, cut into chunks.

Padding costs nothing: the chunk loop takes the valid rows only (gathered on the device, by an index that
`torch.nonzero_static` builds without a host sync, since the count is already known on the host from the
call's one sync in `checks.valid_counts`), and scatters per-row outputs back, leaving 0 at skipped rows.
The per-row inputs (ids, the gradient's per-token terms) are gathered once per call and the per-row outputs
scattered once, not per chunk: each launch saved counts where a call is host-bound (scoring at 4k tokens).
Without padding the chunks are plain slices: no gather, no scatter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Chunk(NamedTuple):
    """One chunk of rows of the flattened `[N, ...]` inputs."""

    span: slice  # its rows' places among the valid rows, in order (the rows themselves when none is skipped)
    size: int  # n, the number of rows
    seqs: slice | None  # sequence-level sampling: the sequences (rows of the (B, T) inputs) it holds whole
    index: torch.Tensor | None  # [n_valid] int64 indices of every valid row, ascending; None: no row skipped

    @property
    def rows(self) -> slice | torch.Tensor:
        """Its rows of the flattened inputs: a slice (no row skipped), or [n] indices (a view of `index`)."""
        return self.span if self.index is None else self.index[self.span]


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
    return [Chunk(slice(s, e), e - s, seqs, index) for s, e, seqs in spans]


def gather_valid(values: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """The valid rows of `values` [N, ...] in valid-row order (what `Chunk.span` indexes), `index` being the
    chunks' `Chunk.index`: one gather for the whole call, or `values` itself when no row is skipped."""
    return values if index is None else values.index_select(0, index)


def scatter_rows(dense: torch.Tensor, rows: slice | torch.Tensor, values: torch.Tensor) -> None:
    """dense[rows] = values, for a slice or an index of rows (in place)."""
    if isinstance(rows, slice):
        dense[rows].copy_(values)
    else:
        dense.index_copy_(0, rows, values)
