"""Which rows the GEMMs see: the valid (unmasked) rows of the flattened inputs, cut into chunks.

Padding costs nothing: the chunk loop takes the valid rows only (gathered on the device, by an index that
`torch.nonzero_static` builds without a host sync) and scatters per-row outputs back, leaving 0 at skipped
rows. The host needs the valid count to size the cuBLAS GEMMs: the call's one sync (`checks.DeviceCounts`),
which a `Plan` defers until the first chunk is queued (see there).
The per-row inputs (ids, the gradient's per-token terms) are gathered once per call and the per-row outputs
scattered once, not per chunk: each launch saved counts where a call is host-bound (scoring at 4k tokens).
Without padding the chunks are plain slices: no gather, no scatter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .checks import DeviceCounts


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
    valid: torch.Tensor | None,
    n_rows: int,
    counts: list[int],
    rows_per_chunk: int,
    *,
    whole_sequences: bool,
    index: torch.Tensor | None = None,
    start: int = 0,
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
        index: the valid rows' index if built already (valid rows first, in order; longer is fine).
        start: the valid rows before it are planned already (token level only).

    Returns:
        The chunks in row order; none for rows that do not count (all padding: no chunk at all).
    """
    n_valid = sum(counts)
    index = None
    if n_valid == n_rows:
        index = None  # every row counts: slices, no gather
    elif index is None:
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
        spans = [(s, min(s + rows_per_chunk, n_valid), None) for s in range(start, n_valid, rows_per_chunk)]
    return [Chunk(slice(s, e), e - s, seqs, index) for s, e, seqs in spans]


class Plan:
    """The chunks of one call, the first of them queued before the host knows the valid count.

    The count comes back by the call's one host sync (`DeviceCounts`). Waiting for it first left the device
    idle while the host then planned and launched the first chunk; instead, the first chunk takes the first
    `rows_per_chunk` entries of the valid-row index, built with room for every row (valid rows first, then
    fill pointing at row 0), and is queued before the host waits. Its entries beyond the count are dead:
    the chunk loop zeroes their hidden rows and gradient scale (`live`) and scatters nothing of theirs.
    Sequence-level sampling packs whole sequences by their per-sequence counts, so it plans after the sync.

    Args:
        valid: [n_rows] bool, True where a row counts; None: every row counts.
        n_rows: N = B * T; counts: the pending counts, per sequence with `whole_sequences`.
        rows_per_chunk, whole_sequences: as for `plan_chunks`.
    """

    def __init__(
        self,
        valid: torch.Tensor | None,
        n_rows: int,
        counts: DeviceCounts,
        rows_per_chunk: int,
        *,
        whole_sequences: bool,
    ):
        self.valid, self.n_rows, self.rows_per_chunk, self.whole = valid, n_rows, rows_per_chunk, whole_sequences
        self.counts = counts
        # [n_rows] in valid-row order (valid rows first, fill 0 after them), None: every row counts
        self.index = None if valid is None else torch.nonzero_static(valid, size=n_rows, fill_value=0).squeeze(1)
        self.first: Chunk | None = None
        self.live: torch.Tensor | None = None  # [first.size] bool: False at the first chunk's dead entries
        if n_rows and not whole_sequences:
            size = min(rows_per_chunk, n_rows)
            self.first = Chunk(slice(0, size), size, None, self.index)
            if valid is not None:
                self.live = torch.arange(size, device=valid.device) < counts.total
        self.n_valid: int | None = None
        self._rest: list[Chunk] | None = None

    def rest(self) -> list[Chunk]:
        """The chunks after `first` (all of them without one). Waits for the counts: ValueError on bad ids."""
        if self._rest is None:
            counts = self.counts.result()
            self.n_valid = sum(counts)
            start = 0 if self.first is None else self.first.size
            self._rest = plan_chunks(
                self.valid,
                self.n_rows,
                counts,
                self.rows_per_chunk,
                whole_sequences=self.whole,
                index=self.index,
                start=start,
            )
        return self._rest

    @property
    def skipping(self) -> bool:
        """Whether some row counts not (after `rest`)."""
        self.rest()
        return self.n_valid != self.n_rows


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
