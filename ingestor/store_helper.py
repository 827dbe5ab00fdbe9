"""Run the local store's file I/O in a helper process instead of worker threads.

An ingestor's business (``[ingestor] store_helper``, on by default for a ``file://`` store):
the ingestor's runtime chooses it from its config (:mod:`ingestor.publish`), and no other
process runs one.

Why: a local put is a dozen syscalls (open, write, fsync, flock, rename, fsync of the
directory). In a worker thread each one gives up the GIL and must win it back from an event
loop that is busy decoding requests; under load a 0.6 ms put took 4 ms of wall time, and
every client waiting for that flush waited with it. A helper process owns its own GIL: the
event loop pays one socket write per operation and reads the answer when it arrives, with
no thread hop at all.

Semantics are the :class:`~icefloe.store.local.LocalStore`'s, because the helper runs that
very class; only the transport differs. If the helper dies, operations in flight fail with
an *ambiguous* :class:`~icefloe.errors.TransientStoreError` (a put may or may not have
landed; the retry layer and the manifest's idempotent producer handle that), and the next
operation starts a fresh helper. It runs at a lower priority (``HELPER_NICE``) than the
event loop it serves. The helper exits when its parent's socket closes, so a
``kill -9`` of the parent leaves nothing behind; it ignores SIGINT/SIGTERM so that a
shutdown's final flush still has a store to write to.

Batch bodies travel raw and are compressed here (:meth:`ProcessAsyncStore.put_encoded`):
zstd was the largest piece of a flush left on the event loop.

Wire format (private to one parent and its child): frames of a 4-byte little-endian length.
A request frame holds ``(id, op, args, kwargs)`` as a pickle (its own length first) and
then the pickle's out-of-band buffers, each with a header saying where it is: in the frame
after the header, or in the shared arena (:mod:`ingestor.helper_arena`) at an offset
(:func:`_framed`: a batch's records are never copied into the pickle, and large ones not
into the socket either). An answer frame is a pickle of ``(id, True, result)`` or
``(id, False, exception)``: the caller sees the very exception the store raised.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from icefloe.errors import PermanentStoreError, TransientStoreError
from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    EncodedPut,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
    encode_for_put,
)
from icefloe.store.local import LocalStore
from ingestor.helper_arena import MIN_SHARED_BYTES, Arena, attach

log = logging.getLogger("icefloe.store")

_LENGTH = struct.Struct("<I")
_BUFFER = struct.Struct("<BIQ")
"""An out-of-band buffer's header: where it is (:data:`_INLINE` or :data:`_SHARED`), its
length, and its offset in the arena (0 when inline)."""
_INLINE, _SHARED = 0, 1
_WORKER_THREADS = 4
"""Operations the helper runs at once: a slow list never holds up a flush's put."""
HELPER_EXIT_S = 10.0
"""How long a helper whose parent closed its socket lets jobs in flight finish; the parent
waits a little longer than this before it kills the helper, so the helper, not a kill,
decides (a job that never finishes must not hold a shutdown forever)."""
_MUTATING = frozenset({"put", "put_encoded", "delete", "job"})
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
"""Send and receive buffer asked for on the channel to the helper (the kernel caps it at
``net.core.wmem_max``/``rmem_max``). Why: a flush's raw block (~330 KB at full gRPC load)
overflows the default ~208 KB, so the loop's write left a remainder to copy and send
later and the helper read it in pieces; measured under that load, the channel's part of a
flush fell from 225 to 92 µs on average (both ends asked for both buffers, as set here,
before the shared arena took large blocks off the socket: the figure is now the path of
a block that finds no room in the arena, or of a system without ``memfd_create``)."""
HELPER_NICE = 5
"""The helper runs this much nicer than its parent. Why: on a busy machine its CPU work
(compression, syscalls) competed with the event loop and gRPC's completion-queue thread,
which are on every request's path; deprioritized, it waits a little longer and the front
accepts calls sooner (gRPC unary +5 % measured on 2 cores). An idle machine sees no
difference: nice only matters when something else wants the CPU."""


class _Channel(asyncio.Protocol):
    """The parent's end: frames out, answers matched to waiting futures by id."""

    def __init__(self, arena: Arena | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.arena = arena
        self.pending: dict[int, tuple[asyncio.Future[Any], str, str]] = {}
        self.shared: dict[int, list[int]] = {}  # request id -> arena offsets it still uses
        self._buffer = bytearray()
        self._next_id = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def call(self, op: str, key: str, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> asyncio.Future[Any]:
        assert self.transport is not None
        self._next_id += 1
        frame, offsets = _framed((self._next_id, op, args, kwargs), self.arena)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self._next_id] = (future, op, key)
        if offsets:
            self.shared[self._next_id] = offsets
        self.transport.writelines(frame)  # no joined copy
        return future

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            (size,) = _LENGTH.unpack_from(buffer)
            if len(buffer) < 4 + size:
                return
            with memoryview(buffer) as view, view[4:4 + size] as frame:
                request_id, ok, value = pickle.loads(frame)
            del buffer[:4 + size]  # only once no view of it is left
            self._release(request_id)  # answered: the helper is done with its blocks
            waiting = self.pending.pop(request_id, None)
            if waiting is None or waiting[0].done():
                continue  # its caller gave up (a flush timeout): nothing to answer
            waiting[0].set_result(value) if ok else waiting[0].set_exception(value)

    def _release(self, request_id: int) -> None:
        offsets = self.shared.pop(request_id, None)
        if offsets and self.arena is not None:
            for offset in offsets:
                self.arena.release(offset)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.shared.clear()
        if self.arena is not None:  # a new helper gets a new arena
            self.arena.close()
        for future, op, key in self.pending.values():
            if not future.done():
                future.set_exception(TransientStoreError(
                    f"the local store's helper process exited during {op} {key!r}",
                    op=op, key=key, ambiguous=op in _MUTATING, code="HelperExited"))
        self.pending.clear()


def _framed(message: Any, arena: Arena | None = None
            ) -> tuple[list[bytes | memoryview], list[int]]:
    """``message`` as the parts of one request frame (total length, pickle length, the
    pickle, then each out-of-band buffer: its header, and its bytes unless it went to the
    arena), and the arena offsets it placed there (to release when it is answered).

    Why out of band: a batch block (~300 KB per flush at full gRPC load) pickled in band is
    copied into the pickle (~90 µs on the event loop) before the socket copies it again;
    as a ``PickleBuffer`` it goes from the builder's buffer to the arena (or the socket)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    parts: list[bytes | memoryview] = [b"", _LENGTH.pack(len(head)), head]
    offsets: list[int] = []
    total = 4 + len(head)
    for buffer in buffers:
        view = buffer.raw()
        offset = arena.place(view) if arena is not None and \
            view.nbytes >= MIN_SHARED_BYTES else None
        if offset is None:
            parts += (_BUFFER.pack(_INLINE, view.nbytes, 0), view)
            total += _BUFFER.size + view.nbytes
        else:
            offsets.append(offset)
            parts.append(_BUFFER.pack(_SHARED, view.nbytes, offset))
            total += _BUFFER.size
    parts[0] = _LENGTH.pack(total)
    return parts, offsets


def _unframed(frame: memoryview, arena: memoryview | None = None) -> Any:
    """The message of one request frame (see :func:`_framed`); its out-of-band buffers are
    views of ``frame``, which they keep alive, or of ``arena``, which the parent leaves
    alone until this request is answered."""
    (size,) = _LENGTH.unpack_from(frame)
    buffers: list[memoryview] = []
    at = 4 + size
    while at < len(frame):
        where, length, offset = _BUFFER.unpack_from(frame, at)
        at += _BUFFER.size
        if where == _SHARED:
            if arena is None:
                raise ValueError("a request placed a buffer in a shared arena this helper "
                                 "was not given")
            buffers.append(arena[offset:offset + length])
        else:
            buffers.append(frame[at:at + length])
            at += length
    return pickle.loads(frame[4:4 + size], buffers=buffers)


def _child_environment() -> dict[str, str]:
    """This environment, with the directory this code was imported from first on the path
    (so the helper runs this very code even when it is not installed)."""
    home = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": home + (os.pathsep + path if path else "")}


class Job(Protocol):
    """Work for :meth:`ProcessAsyncStore.run_job` (must pickle)."""

    async def run(self, store: ObjectStore, state: dict[str, Any]) -> Any: ...


def _job_label(job: Job) -> str:
    """What an error about ``job`` names: its key if it has one (a batch), else its type."""
    return getattr(job, "key", type(job).__name__)


class ProcessAsyncStore(AsyncObjectStore):
    """A :class:`~icefloe.store.local.LocalStore` on ``root``, served by a helper process."""

    def __init__(self, root: str | os.PathLike[str], *, shared_memory: bool = True) -> None:
        """``shared_memory`` False: blocks always travel in the socket (tests compare)."""
        self.shared_memory = shared_memory
        local = LocalStore(root)  # creates the directory, and fails now if it cannot
        self.url, self.root = local.url, str(local.root)
        self._channel: _Channel | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._starting: asyncio.Lock | None = None  # made in the loop that first uses it

    @property
    def helper_pid(self) -> int | None:
        """The helper process's pid (None before the first operation and after close)."""
        return None if self._process is None else self._process.pid

    async def _connect(self) -> _Channel:
        channel = self._channel
        if channel is not None and not channel.closed:
            return channel
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._channel is not None and not self._channel.closed:
                return self._channel
            if self._process is not None:  # its channel closed: it is gone or going
                await self._retire(self._process)
            ours, theirs = socket.socketpair()
            with contextlib.suppress(OSError):  # a smaller buffer still works
                for end in (ours, theirs):  # both ends, both ways: as measured
                    end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
                    end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            arena = Arena.create() if self.shared_memory else None
            shared = [str(arena.fd), str(arena.size)] if arena is not None else []
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "ingestor.store_helper", str(theirs.fileno()),
                     self.root, *shared],
                    pass_fds=(theirs.fileno(),) + ((arena.fd,) if arena is not None else ()),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,  # never holds the ingestor's stdout open
                    env=_child_environment())
            except OSError as exc:
                ours.close()
                if arena is not None:
                    arena.close()
                raise PermanentStoreError(
                    f"cannot start the local store's helper process ({sys.executable}): "
                    f"{exc.strerror or exc}", op="open") from exc
            finally:
                theirs.close()
            log.debug("local store helper started (pid %d, shared arena: %s)",
                      self._process.pid, "yes" if arena is not None else "no")
            _, self._channel = await asyncio.get_running_loop().create_unix_connection(
                lambda: _Channel(arena), sock=ours)
            return self._channel

    @staticmethod
    async def _retire(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.kill()
            await asyncio.to_thread(process.wait)
        log.warning("the local store's helper process (pid %d) exited with status %s; "
                    "starting a new one", process.pid, process.returncode)

    async def _call(self, op: str, key: str, *args: Any, **kwargs: Any) -> Any:
        channel = await self._connect()
        return await channel.call(op, key, args, kwargs)

    async def get(self, key: str) -> GetResult:
        result: GetResult = await self._call("get", key, key)
        return result

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        result: PutResult = await self._call("put", key, key, data, if_match=if_match,
                                             if_none_match=if_none_match)
        return result

    async def put_encoded(self, key: str, body: Encodable) -> EncodedPut:
        """Encode (compress) ``body`` in the helper too: it ships raw, and the loop never
        spends its CPU on zstd."""
        result: EncodedPut = await self._call("put_encoded", key, key, body)
        return result

    async def run_job(self, job: Job) -> Any:
        """Run ``await job.run(store, state)`` in the helper, on its event loop, with its
        ``LocalStore`` and a dict that persists across the jobs of this helper; return the
        result (or raise what it raised). Why: a multi-step write (a batch file, then its
        manifest append) takes one round trip, and its CPU stays off this event loop."""
        return await self._call("job", _job_label(job), job)

    def submit_job(self, job: Job) -> asyncio.Future[Any] | None:
        """Send ``job`` to the running helper now, without awaiting; None when no helper is
        connected (then :meth:`run_job` starts one)."""
        channel = self._channel
        if channel is None or channel.closed:
            return None
        return channel.call("job", _job_label(job), (job,), {})

    async def delete(self, key: str) -> None:
        await self._call("delete", key, key)

    async def list(self, prefix: str = "") -> ListResult:
        result: ListResult = await self._call("list", prefix, prefix)
        return result

    async def head(self, key: str) -> ObjectInfo:
        result: ObjectInfo = await self._call("head", key, key)
        return result

    async def close(self) -> None:
        """Stop the helper: it exits once its socket closes (after answering what it has)."""
        channel, process, self._channel, self._process = self._channel, self._process, \
            None, None
        if channel is not None and channel.transport is not None:
            channel.transport.close()
        if process is not None:
            try:  # it gives up on its jobs first (HELPER_EXIT_S): a kill is the last resort
                await asyncio.to_thread(process.wait, HELPER_EXIT_S + 5.0)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)


# -- the helper process -----------------------------------------------------------------------


def serve(fd: int, root: str, arena_fd: int | None = None, arena_size: int = 0) -> None:
    """Answer requests on socket ``fd`` with a LocalStore on ``root`` until it closes;
    ``arena_fd``: the shared arena large blocks arrive in (:mod:`ingestor.helper_arena`)."""
    arena = attach(arena_fd, arena_size) if arena_fd is not None else None
    with contextlib.suppress(OSError):  # a sandbox may forbid it: run at normal priority
        os.nice(HELPER_NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    store = LocalStore(root)
    sock = socket.socket(fileno=fd)
    send_lock = threading.Lock()

    def answer(request_id: int, ok: bool, value: Any) -> None:
        try:
            frame = pickle.dumps((request_id, ok, value), protocol=5)
        except Exception:  # an exception that cannot be pickled: say what it was
            frame = pickle.dumps((request_id, False, PermanentStoreError(
                f"local store operation failed in the helper process: {value!r}")), protocol=5)
        with send_lock, contextlib.suppress(OSError):  # OSError: the parent is gone
            sock.sendall(_LENGTH.pack(len(frame)) + frame)

    def put_encoded(key: str, body: Encodable) -> EncodedPut:
        data, checksum = encode_for_put(body)
        return EncodedPut(store.put(key, data), len(data), checksum)

    jobs = _JobLoop(store, answer)

    def run(request_id: int, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            result = put_encoded(*args) if op == "put_encoded" \
                else getattr(store, op)(*args, **kwargs)
        except Exception as exc:  # the caller gets it, as it would from a thread
            answer(request_id, False, exc)
        else:
            answer(request_id, True, result)

    reader = sock.makefile("rb")
    with ThreadPoolExecutor(_WORKER_THREADS, thread_name_prefix="store") as pool:
        while True:
            header = reader.read(4)
            if len(header) < 4:  # the parent closed its end (or died): finish what runs
                abandoned = jobs.finish()
                if abandoned:  # their requests were answered 503 already: never acknowledged
                    print(f"icefloe store helper: {abandoned} batch job(s) still running "
                          f"{HELPER_EXIT_S:g}s after the ingestor closed; exiting without "
                          "them", file=sys.stderr)
                return
            (size,) = _LENGTH.unpack(header)
            request_id, op, args, kwargs = _unframed(memoryview(reader.read(size)), arena)
            if op == "job":  # on the job loop, which never blocks this reader
                jobs.submit(request_id, args[0])
            else:
                pool.submit(run, request_id, op, args, kwargs)


class _JobLoop:
    """The helper's event loop for jobs, in a thread of its own, started by the first job
    (only the reader thread submits)."""

    def __init__(self, store: ObjectStore, answer: Callable[[int, bool, Any], None]) -> None:
        self.store = store
        self.answer = answer
        self.state: dict[str, Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.running: set[concurrent.futures.Future[Any]] = set()

    def submit(self, request_id: int, job: Job) -> None:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="store-jobs",
                             daemon=True).start()
        try:
            running = asyncio.run_coroutine_threadsafe(job.run(self.store, self.state),
                                                       self.loop)
        except Exception as exc:  # not even a coroutine: say so
            self.answer(request_id, False, exc)
            return

        def done(finished: concurrent.futures.Future[Any]) -> None:
            self.running.discard(finished)
            error = finished.exception()
            self.answer(request_id, error is None,
                        finished.result() if error is None else error)

        self.running.add(running)
        running.add_done_callback(done)

    def finish(self, timeout_s: float = HELPER_EXIT_S) -> int:
        """Wait for the jobs in flight: a half-done append is never cut off at exit (the
        loop's thread is a daemon), even when nobody is left to read the answer. Returns
        how many are still running after ``timeout_s`` (the helper exits without them)."""
        _, running = concurrent.futures.wait(list(self.running), timeout=timeout_s)
        return len(running)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2],
          *((int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else ()))
