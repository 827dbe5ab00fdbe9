"""A durable object store on a local directory: the embedded default (``file:///path``).

Why it looks like this:

* **Atomic writes.** Every put writes a temp file in the target directory, fsyncs it,
  renames it over the key and fsyncs the directory, so a crash leaves the old or the new
  object, never a torn one.
* **Conditional puts across processes.** Several ingestor processes share one directory, so
  the ETag check and the rename happen under an exclusive ``flock`` (striped over a fixed
  set of lock files so unique batch keys do not leave lock files behind). Unconditional puts
  and deletes take the same lock, which keeps every write linearizable.
* **ETags from content.** The ETag is a BLAKE2b digest of the bytes: it changes whenever the
  bytes change (inode numbers and coarse mtimes can repeat; content cannot lie), which is
  what S3 guarantees too.
* **Store time.** The local clock is the store's clock; ``last_modified`` is the file mtime.
* **A replaced object's inode is kept and reused.** A replace keeps the old version's inode
  as the key's *spare* (``.icefloe-spare-<hash>`` beside it, a hard link made under the
  lock just before the rename), and the key's next put writes into that spare instead of
  creating a file. Why: a manifest is replaced on every flush, and on ext4 without a
  journal (this project's VM) every create skips each inode freed in the last 60-300 s, one
  cache lookup apiece: at ~240 flushes/s the manifest's freed inodes made a create cost
  100-350 µs of kernel CPU and a third of the store helper's CPU went to it. With the
  spare, a replace neither frees nor allocates an inode. Safety rests on ``flock``: a
  writer takes a spare only with an exclusive non-blocking lock and a link count of 1 (so
  it is no longer any key's object, and no reader holds it), and keeps the lock until its
  rename; a reader locks what it opened shared and reads it only if it is still the
  key's inode, else it opens again. A reader that does not follow this (``cat``, another
  tool) can see a replaced version change under it once the key is replaced again.
  The replaced version becomes the spare only once the rename that replaced it is durable
  (the directory fsynced): until then it is linked under a *pending* name no writer takes.
  Why: until that fsync the directory on disk still names the old inode as the key, and a
  writer that took it as its spare and wrote into it meanwhile would, on a power loss,
  leave the key holding that writer's bytes (torn, or a version whose compare-and-swap
  never won) instead of the old or the new object.
* **An error after the rename is ambiguous.** Once the new version is renamed over the
  key, a failing directory fsync (or anything after it) leaves it visible but perhaps not
  durable: the error says the write may have been applied (``ambiguous``), whatever kind
  it is, so nobody tells a client "not stored" about a version a reader may already see.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from icefloe.errors import (
    NotFound,
    PermanentStoreError,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from icefloe.store.base import (
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
    check_key,
)

_RESERVED = ".icefloe-"
_LOCK_DIR = ".icefloe-locks"
_LOCK_STRIPES = 64
_READ_TRIES = 100
"""Times a get opens a key again because it was replaced while being opened."""
_TRANSIENT_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EAGAIN, errno.EINTR, errno.EDQUOT,
                     errno.ESTALE, errno.ETIMEDOUT}


def content_etag(data: bytes | memoryview) -> str:
    """The ETag of ``data``: quoted hex BLAKE2b-128, S3-shaped and content-derived."""
    return '"' + hashlib.blake2b(data, digest_size=16).hexdigest() + '"'


class LocalStore(ObjectStore):
    """Objects as files under ``root``; safe for many processes on one host."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        try:
            (self.root / _LOCK_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PermanentStoreError(
                f"cannot create the local store directory {self.root}: {exc.strerror}; "
                "fix [store] url or the directory's permissions", op="open") from exc
        self.url = self.root.as_uri()

    # -- helpers -----------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        stripe = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=2).digest()) \
            % _LOCK_STRIPES
        fd = os.open(self.root / _LOCK_DIR / f"{stripe:02d}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _error(self, exc: OSError, op: str, key: str) -> Exception:
        if isinstance(exc, FileNotFoundError):
            return NotFound(f"no such key {key!r} in {self.url}", op=op, key=key)
        message = f"local store {op} {key!r} failed: {exc.strerror or exc}"
        if exc.errno in _TRANSIENT_ERRNOS:
            return TransientStoreError(message, op=op, key=key, ambiguous=op != "get",
                                       code=errno.errorcode.get(exc.errno or 0, ""))
        return PermanentStoreError(message + f"; check permissions under {self.root}",
                                   op=op, key=key)

    def _fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- interface -----------------------------------------------------------------------

    def get(self, key: str) -> GetResult:
        data, mtime = self._read_current(self._path(key), key, "get")
        return GetResult(data=data, etag=content_etag(data), last_modified=mtime,
                         store_time=time.time())

    def _read_current(self, path: Path, key: str, op: str) -> tuple[bytes, float]:
        """The bytes and mtime of the object at ``path``, read under a shared ``flock`` and
        only while ``path`` still names the inode opened (see the module docstring: a
        replaced version's inode is reused by a later put, which locks it exclusively)."""
        for _ in range(_READ_TRIES):
            try:
                with open(path, "rb") as handle:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
                    opened = os.fstat(handle.fileno())
                    # FileNotFoundError: deleted since we opened it
                    current = os.stat(path)
                    if (current.st_ino, current.st_dev) != (opened.st_ino, opened.st_dev):
                        continue  # replaced since we opened it: read the new version
                    return handle.read(), opened.st_mtime
            except (FileNotFoundError, IsADirectoryError):
                raise NotFound(f"no such key {key!r} in {self.url}", op=op,
                               key=key) from None
            except OSError as exc:
                raise self._error(exc, op, key) from exc
        raise TransientStoreError(
            f"local store {op} {key!r}: replaced {_READ_TRIES} times while being read; "
            "retry", op=op, key=key, ambiguous=False, code="ReadRace")

    def head(self, key: str) -> ObjectInfo:
        result = self.get(key)
        return ObjectInfo(key=key, size=len(result.data), last_modified=result.last_modified,
                          etag=result.etag)

    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: IfNoneMatch = None) -> PutResult:
        path = self._path(key)
        if if_none_match not in (None, "*"):
            raise ValueError("if_none_match only supports '*'")
        replaced = False
        try:
            if if_match is not None or if_none_match is not None:
                # Cheap early answer for a lost race: skip the temp write and its fsync.
                # The authoritative check is repeated under the lock below.
                self._check_condition(path, key, if_match, if_none_match)
            # a key that must not exist replaces nothing: no spare to take or to keep
            creates = if_none_match is not None
            tmp, handle, reused = self._stage(path, reuse=not creates)
            try:
                handle.write(data)
                if reused:  # a spare may have held more bytes; a new file holds none
                    handle.truncate()
                handle.flush()
                os.fsync(handle.fileno())
                with self._locked(key):
                    self._check_condition(path, key, if_match, if_none_match)
                    kept = not creates and self._keep_spare(path)
                    os.replace(tmp, path)
                    replaced = True
                    self._fsync_dir(path.parent)
                    if kept:  # the replacement is durable: the old version may be reused
                        self._promote_spare(path)
                    handle.close()  # releases a reused spare's lock before the key's
            finally:
                handle.close()
                if not replaced:  # a lost race or an error: the temp file must go
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
        except OSError as exc:
            error = self._error(exc, "put", key)
            if replaced and isinstance(error, StoreError):  # visible, perhaps not durable
                error.ambiguous = True
                error.args = (f"{error.args[0]} (after the new version replaced the old: it "
                              "may be stored)",)
            raise error from exc
        return PutResult(etag=content_etag(data), store_time=time.time())

    def _spare(self, path: Path, kind: str = "spare") -> Path:
        """The key's spare (``kind`` "pending": its replaced version not yet durable)."""
        digest = hashlib.blake2b(path.name.encode(), digest_size=8).hexdigest()
        return path.parent / f"{_RESERVED}{kind}-{digest}"

    def _stage(self, path: Path, *, reuse: bool) -> tuple[Path, BinaryIO, bool]:
        """A temp file beside ``path`` to write the new version into, open for writing at
        offset 0, and whether it is the key's spare (taken when that is safe) rather than a
        new, empty file."""
        tmp = path.parent / f"{_RESERVED}tmp-{uuid.uuid4().hex}"
        if reuse:
            handle = self._take_spare(path, tmp)
            if handle is not None:
                return tmp, handle, True
        try:
            return tmp, open(tmp, "wb"), False
        except FileNotFoundError:  # the key's first object in its directory
            path.parent.mkdir(parents=True, exist_ok=True)
            return tmp, open(tmp, "wb"), False

    def _take_spare(self, path: Path, tmp: Path) -> BinaryIO | None:
        """The key's spare renamed to ``tmp`` and locked exclusively, or None (no spare, a
        reader holds it, or it is still linked elsewhere: then ``tmp`` is gone again)."""
        try:
            os.rename(self._spare(path), tmp)  # one taker wins; the others see ENOENT
        except FileNotFoundError:
            return None
        try:
            fd = os.open(tmp, os.O_WRONLY)
        except OSError as exc:  # never leave it under a temp name nobody takes again
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(exc, PermissionError):  # another user's old version (a shared
                return None  # directory): write a new file instead
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # 1: only our name links it, so it is no key's object (a crash between
            # _keep_spare's link and its rename leaves the spare linked to the key too)
            if os.fstat(fd).st_nlink == 1:
                return os.fdopen(fd, "wb")
        except BlockingIOError:  # a reader still reads this old version: leave it be
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        tmp.unlink()
        return None

    def _keep_spare(self, path: Path) -> bool:
        """Link the version about to be replaced under the key's pending name (under the
        key's lock, just before the rename), so the rename frees no inode; True if linked.
        :meth:`_promote_spare` makes it the spare once the rename is durable."""
        # FileNotFoundError: nothing is replaced; FileExistsError: left by a crash between
        # a link and its promotion (promoted by this put); PermissionError: another user's
        # file, which protected_hardlinks will not link
        try:
            os.link(path, self._spare(path, "pending"))
        except FileExistsError:
            return True
        except (FileNotFoundError, PermissionError):
            return False
        return True

    def _promote_spare(self, path: Path) -> None:
        """The pending version becomes the key's spare (replacing an older spare nobody
        took: that one is freed, as it was when no second spare could be kept). Best
        effort: the put is durable already, and a version left pending is promoted by the
        key's next replace."""
        with contextlib.suppress(OSError):
            os.replace(self._spare(path, "pending"), self._spare(path))

    def _check_condition(self, path: Path, key: str, if_match: str | None,
                         if_none_match: IfNoneMatch) -> None:
        if if_none_match == "*" and path.exists():
            raise PreconditionFailed(f"{key!r} already exists (If-None-Match: *)",
                                     op="put", key=key)
        if if_match is not None:
            try:
                current = content_etag(self._read_current(path, key, "put")[0])
            except NotFound:
                raise PreconditionFailed(f"{key!r} does not exist (If-Match)",
                                         op="put", key=key) from None
            if current != if_match:
                raise PreconditionFailed(f"{key!r} changed: ETag {current} != {if_match}",
                                         op="put", key=key)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            with self._locked(key):
                path.unlink(missing_ok=True)
                self._spare(path).unlink(missing_ok=True)
                self._spare(path, "pending").unlink(missing_ok=True)
                if path.parent.exists():
                    self._fsync_dir(path.parent)
        except OSError as exc:
            raise self._error(exc, "delete", key) from exc

    def list(self, prefix: str = "") -> ListResult:
        directory = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        now = time.time()
        objects: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(directory):
            dirnames[:] = [d for d in dirnames if not d.startswith(_RESERVED)]
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith(_RESERVED):
                    continue
                key = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    stat = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while we listed
                objects.append(ObjectInfo(key=key, size=stat.st_size,
                                          last_modified=stat.st_mtime))
        objects.sort(key=lambda info: info.key)
        return ListResult(objects=objects, store_time=now)
