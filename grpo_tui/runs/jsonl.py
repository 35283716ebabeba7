"""Appending to a run's JSON-lines files (metrics.jsonl, completions.jsonl): whole lines or nothing.

A full disk (or a file-size limit) can accept part of a write and refuse the rest. The part would leave
a torn line that every reader must skip, and the next record would be glued to it. `JsonlAppender`
writes each batch of lines with raw `os.write` calls, syncs it, and on any failure truncates the file
back to where the batch began before the error goes on: readers see the batch whole or not at all.
Each file has one writer (the trainer's main process), so nothing else moves its end meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from grpo_tui.runs.folder import PRIVATE_FILE_MODE


class JsonlAppender:
    """An open JSON-lines file that `append` grows by whole lines; `sync` fsyncs each batch."""

    def __init__(self, path: str | os.PathLike[str], sync: bool = True) -> None:
        self.path = Path(path)
        self.sync = sync
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._fd: int | None = os.open(self.path, flags, PRIVATE_FILE_MODE)

    def append(self, lines: Iterable[str]) -> None:
        """Append `lines` (each one JSON text without its newline) as one batch: all of them or none."""
        if self._fd is None:
            raise ValueError(f"{self.path.name}: appending to a closed file")
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        if not data:
            return
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.sync:
                os.fsync(self._fd)
        except BaseException:
            try:
                os.ftruncate(self._fd, start)  # the torn tail goes; the error still reaches the caller
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
