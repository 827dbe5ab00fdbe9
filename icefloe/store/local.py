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

from icefloe.errors import NotFound, PermanentStoreError, PreconditionFailed, TransientStoreError
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
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
                mtime = os.fstat(handle.fileno()).st_mtime
        except IsADirectoryError:
            raise NotFound(f"no such key {key!r} in {self.url}", op="get", key=key) from None
        except OSError as exc:
            raise self._error(exc, "get", key) from exc
        return GetResult(data=data, etag=content_etag(data), last_modified=mtime,
                         store_time=time.time())

    def head(self, key: str) -> ObjectInfo:
        result = self.get(key)
        return ObjectInfo(key=key, size=len(result.data), last_modified=result.last_modified,
                          etag=result.etag)

    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: IfNoneMatch = None) -> PutResult:
        path = self._path(key)
        if if_none_match not in (None, "*"):
            raise ValueError("if_none_match only supports '*'")
        try:
            if if_match is not None or if_none_match is not None:
                # Cheap early answer for a lost race: skip the temp write and its fsync.
                # The authoritative check is repeated under the lock below.
                self._check_condition(path, key, if_match, if_none_match)
            tmp = path.parent / f"{_RESERVED}tmp-{uuid.uuid4().hex}"
            try:
                handle = open(tmp, "wb")  # noqa: SIM115 - closed below, after the fsync
            except FileNotFoundError:  # the key's first object in its directory
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(tmp, "wb")  # noqa: SIM115
            with handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            replaced = False
            try:
                with self._locked(key):
                    self._check_condition(path, key, if_match, if_none_match)
                    os.replace(tmp, path)
                    replaced = True
                    self._fsync_dir(path.parent)
            finally:
                if not replaced:  # a lost race or an error: the temp file must go
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
        except OSError as exc:
            raise self._error(exc, "put", key) from exc
        return PutResult(etag=content_etag(data), store_time=time.time())

    def _check_condition(self, path: Path, key: str, if_match: str | None,
                         if_none_match: IfNoneMatch) -> None:
        if if_none_match == "*" and path.exists():
            raise PreconditionFailed(f"{key!r} already exists (If-None-Match: *)",
                                     op="put", key=key)
        if if_match is not None:
            try:
                current = content_etag(path.read_bytes())
            except FileNotFoundError:
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
