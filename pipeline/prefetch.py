"""Background prefetch for any iterator: one daemon thread runs ahead, errors surface in the caller.

Shared by the shard reader (decoding) and the training data path (packing);
both are I/O- and numpy-bound work that releases the GIL often enough for one
thread to keep the consumer fed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def prefetched(source: Iterator[T], depth: int, name: str = "prefetch") -> Iterator[T]:
    """Yield `source`'s items, produced `depth` ahead in a daemon thread (depth <= 0: inline).

    An exception in `source` is raised here, in the consumer; closing the
    generator early stops the thread.
    """
    if depth <= 0:
        yield from source
        return
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in source:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as err:  # handed to the consumer, raised there
            put(err)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
