"""Shared memory that carries large batch blocks from an ingestor to its store helper.

Why: every flush sends its raw block (~330 KB at full gRPC load) to the helper. Written to
the channel's socket, the kernel copied it into socket buffers on the event loop's thread
(measured at that load: ~155 µs of the loop's CPU per flush, about 10 µs per call) and out
again in the helper's reader. Copied into a shared mapping instead, the loop pays one
``memcpy`` and the helper compresses straight from the pages: the socket carries only the
request's pickle and where the block lies.

How: the parent makes an anonymous ``memfd`` of :data:`ARENA_BYTES`, passes its descriptor
to the helper it starts, and places each large out-of-band buffer first-fit in a free
range; the range is released when the helper's answer for that request arrives (the helper
answers only after it is done with the block). A buffer that does not fit (the arena is
full, or it is huge) travels in the socket as before, so nothing ever waits for room.
Linux only (``os.memfd_create``); elsewhere :meth:`Arena.create` gives None and everything
goes through the socket.
"""

from __future__ import annotations

import contextlib
import mmap
import os

ARENA_BYTES = 32 * 1024 * 1024
"""The mapping's size. Pages are only backed once written, and first-fit placement keeps
reusing the low ones, so a helper with one flush in flight touches about one block's worth."""
MIN_SHARED_BYTES = 16 * 1024
"""Smaller out-of-band buffers go through the socket: for them the copy costs the same."""


class Arena:
    """The parent's side: a shared mapping and the ranges of it requests still use."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size)
        self._used: dict[int, int] = {}  # offset -> length, of ranges the helper may read

    @classmethod
    def create(cls, size: int = ARENA_BYTES) -> Arena | None:
        """A new arena, or None where shared memory cannot be had (not Linux, or the
        system refused: then blocks go through the socket)."""
        memfd_create = getattr(os, "memfd_create", None)
        if memfd_create is None:
            return None
        try:
            fd = memfd_create("icefloe-helper-arena", os.MFD_CLOEXEC)
        except OSError:
            return None
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except (OSError, ValueError):
            os.close(fd)
            return None

    @property
    def used_bytes(self) -> int:
        """Bytes placed and not yet released."""
        return sum(self._used.values())

    def place(self, data: memoryview) -> int | None:
        """Copy ``data`` into the first free range that holds it; its offset, or None when
        no range does (the caller sends it another way)."""
        length = data.nbytes
        at = 0
        for offset in sorted(self._used):
            if offset - at >= length:
                break
            at = max(at, offset + self._used[offset])
        if at + length > self.size:
            return None
        self._map[at:at + length] = data
        self._used[at] = length
        return at

    def release(self, offset: int) -> None:
        """The helper is done with the range at ``offset``: it may be written again."""
        self._used.pop(offset, None)

    def close(self) -> None:
        """Unmap and close this process's side (a helper still running keeps its own)."""
        self._used.clear()
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def attach(fd: int, size: int) -> memoryview:
    """The helper's side: the arena the parent passed as ``fd``, as one view to slice."""
    return memoryview(mmap.mmap(fd, size))
