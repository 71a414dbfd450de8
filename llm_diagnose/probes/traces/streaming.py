"""Streaming helpers: a column of numbers that grows in numpy chunks (8 bytes a request, not
a Python object), and an iterator run ahead in a thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

__all__ = ["Column", "prefetched"]


class Column:
    def __init__(self, dtype) -> None:
        self._dtype = np.dtype(dtype)
        self._chunks: list[np.ndarray] = []
        self._pending: list = []

    def extend(self, values) -> None:
        if len(values) >= 1 << 12:  # a whole batch: straight to numpy
            self._flush()
            self._chunks.append(np.array(values, dtype=self._dtype))
            return
        self._pending.extend(values)
        if len(self._pending) >= 1 << 16:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._chunks.append(np.array(self._pending, dtype=self._dtype))
            self._pending = []

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks) + len(self._pending)

    def array(self) -> np.ndarray:
        self._flush()
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.empty(0, dtype=self._dtype)


class _Failed(NamedTuple):
    error: BaseException


def prefetched(items: Iterator, depth: int = 2) -> Iterator:
    """Run an iterator in a thread, `depth` items ahead (reading overlaps numpy, which drops the GIL)."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            q.put(_Failed(exc))

    worker = threading.Thread(target=produce, name="trace-reader", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        worker.join(timeout=1.0)
