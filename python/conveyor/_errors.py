"""Conveyor's exceptions (the engine's C++ exceptions arrive as these)."""

from __future__ import annotations


class SampleError(RuntimeError):
    """A sample failed to load (a corrupt or missing file, a failed HTTP read, ...).

    Attributes:
        index: the dataset index of the sample that failed.
        path: its file (or "SHARD (member KEY.jpg)" for tar shards, or the URL).
        reason: the underlying error's message (e.g. the JPEG decoder's).

    Under ``on_error="skip"`` such samples are replaced and counted in ``loader.stats()``
    instead of raising.
    """

    def __init__(self, message: str, index: int, path: str, reason: str = "") -> None:
        super().__init__(message)
        self.index = index
        self.path = path
        self.reason = reason

    def __reduce__(self):  # picklable, e.g. across multiprocessing
        return (type(self), (str(self), self.index, self.path, self.reason))
