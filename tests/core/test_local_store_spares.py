"""The local store's spare inodes: a replace keeps the old version's inode for the key's next
put (see :mod:`icefloe.store.local`), and no reader ever sees a version that is not whole."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from _workers import is_whole, replace_and_read, self_checking

import icefloe.store.local as local_module
from icefloe.errors import NotFound
from icefloe.store.local import LocalStore


def spares(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(".icefloe-spare-")]


def test_should_reuse_the_replaced_versions_inode(tmp_path):
    store = LocalStore(tmp_path)
    store.put("m/k", b"v1" * 3000)
    first = os.stat(tmp_path / "m" / "k").st_ino
    store.put("m/k", b"v2")
    assert len(spares(tmp_path / "m")) == 1  # v1, kept
    store.put("m/k", b"v3")  # written into v1's inode, which is not freed
    assert os.stat(tmp_path / "m" / "k").st_ino == first
    assert store.get("m/k").data == b"v3"  # truncated: nothing of v1's longer bytes left
    assert os.stat(tmp_path / "m" / "k").st_size == 2
    assert [o.key for o in store.list().objects] == ["m/k"]
    assert not [n for n in os.listdir(tmp_path / "m") if n.startswith(".icefloe-tmp")]


def test_should_not_keep_spares_for_keys_only_created(tmp_path):
    store = LocalStore(tmp_path)
    for i in range(3):
        store.put(f"b/{i}", b"x")
        store.put(f"c/{i}", b"x", if_none_match="*")
    assert spares(tmp_path / "b") == []
    assert spares(tmp_path / "c") == []


def test_should_neither_look_for_nor_keep_a_spare_when_creating(tmp_path, monkeypatch):
    """A create (If-None-Match: *) replaces nothing: no rename to claim a spare, no link to
    keep one; only the temp file's rename onto the key."""
    store = LocalStore(tmp_path)
    calls: list[str] = []
    for name in ("link", "rename", "replace"):
        real = getattr(os, name)
        monkeypatch.setattr(local_module.os, name,
                            lambda *a, _real=real, _name=name, **k: (calls.append(_name),
                                                                     _real(*a, **k))[1])
    store.put("b/1", b"batch", if_none_match="*")
    assert calls == ["replace"]
    assert store.get("b/1").data == b"batch"
    calls.clear()
    store.put("m/k", b"v1")
    store.put("m/k", b"v2")  # a replace keeps v1 as the spare
    assert calls.count("link") == 2  # each replace-capable put tries to keep one
    assert "rename" in calls  # and the second looked for one to take


def test_should_delete_the_spare_with_its_key(tmp_path):
    store = LocalStore(tmp_path)
    store.put("k", b"1")
    store.put("k", b"2")
    store.delete("k")
    assert spares(tmp_path) == []
    with pytest.raises(NotFound):
        store.get("k")


def test_should_leave_a_spare_alone_while_a_reader_holds_it(tmp_path):
    store = LocalStore(tmp_path)
    store.put("k", b"old version")
    with open(tmp_path / "k", "rb") as reader:  # a get of the old version, mid-read
        fcntl.flock(reader.fileno(), fcntl.LOCK_SH)
        store.put("k", b"v2")
        store.put("k", b"v3")  # may not write into the inode the reader holds
        assert reader.read() == b"old version"
        assert os.fstat(reader.fileno()).st_ino != os.stat(tmp_path / "k").st_ino
    assert store.get("k").data == b"v3"


def test_should_not_write_into_a_spare_still_linked_to_its_key(tmp_path):
    """A crash between the spare's link and the rename leaves the spare linked to the live
    object too: the next put must not write into it."""
    store = LocalStore(tmp_path)
    store.put("k", b"live")
    os.link(tmp_path / "k", tmp_path / store._spare(tmp_path / "k").name)
    with open(tmp_path / "k", "rb") as live:  # no lock: how an outside reader looks
        store.put("k", b"next")
        assert live.read() == b"live"
    assert store.get("k").data == b"next"


def test_should_read_again_when_the_key_is_replaced_between_open_and_lock(tmp_path,
                                                                         monkeypatch):
    store, other = LocalStore(tmp_path), LocalStore(tmp_path)
    store.put("k", b"v1")
    real_flock = fcntl.flock
    calls: list[int] = []

    def flock_after_a_replace(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_SH and not calls:
            calls.append(fd)
            monkeypatch.setattr(local_module.fcntl, "flock", real_flock)
            other.put("k", b"v2")  # the inode get opened is now the spare
        real_flock(fd, operation)

    monkeypatch.setattr(local_module.fcntl, "flock", flock_after_a_replace)
    assert store.get("k").data == b"v2"
    assert calls  # the race really happened


def test_should_only_ever_read_whole_versions_while_processes_replace(tmp_path):
    processes, seconds = 3, 1.5
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        start = manager.Event()
        futures = [pool.submit(replace_and_read, str(tmp_path), "hot", seconds, seed, start)
                   for seed in range(processes)]
        start.set()
        results = [f.result(timeout=120) for f in futures]
    puts = sum(r[0] for r in results)
    reads = sum(r[1] for r in results)
    assert puts > 30
    assert reads == 3 * puts
    assert sum(r[2] for r in results) == 0
    assert is_whole(LocalStore(tmp_path).get("hot").data)
    assert len(spares(tmp_path)) <= 1


def test_self_checking_bytes_catch_a_torn_read():
    data = self_checking(7, 5000)
    assert is_whole(data)
    assert not is_whole(data[:2000] + self_checking(8, 5000)[2000:])


def test_should_put_when_the_old_version_belongs_to_another_user(tmp_path, monkeypatch):
    """A directory shared by services running as different users: the old version may be
    neither linkable (``fs.protected_hardlinks``) nor writable by this one. The tests run
    as root, whom neither refusal reaches, so the refusals are injected where the file
    system would answer them."""
    store = LocalStore(tmp_path)
    store.put("k", b"v1")
    store.put("k", b"v2")  # v1 is the spare now
    real_open, real_link = os.open, os.link

    def refuse_writing_a_spare(path, flags, *args):
        if ".icefloe-tmp-" in str(path) and flags == os.O_WRONLY:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    def refuse_linking(src, dst, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(src))

    monkeypatch.setattr(local_module.os, "open", refuse_writing_a_spare)
    store.put("k", b"v3")  # the spare could not be written: a new file instead
    assert store.get("k").data == b"v3"
    assert spares(tmp_path) == [store._spare(tmp_path / "k").name]  # v2, kept
    monkeypatch.setattr(local_module.os, "link", refuse_linking)
    store.put("k", b"v4")  # neither: v3's inode is freed, as without spares
    monkeypatch.setattr(local_module.os, "open", real_open)
    monkeypatch.setattr(local_module.os, "link", real_link)
    assert store.get("k").data == b"v4"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".icefloe-tmp")]


def test_should_not_let_a_writer_reuse_the_replaced_version_before_the_replace_is_durable(
        tmp_path):
    """Until the directory is fsynced after a replace, the disk still names the old inode
    as the key: a writer that took it as its spare and wrote into it meanwhile would, on
    a power loss, leave the key holding that writer's bytes. W1 replaces v1 with v2 and
    pauses before its directory fsync; W3 reads v2 and puts v3 against it meanwhile."""
    import threading

    from icefloe.store.local import content_etag

    paused, go, w3_waits = threading.Event(), threading.Event(), threading.Event()

    class PausedBeforeFsync(LocalStore):
        def _fsync_dir(self, path: Path) -> None:
            paused.set()
            assert go.wait(10)
            super()._fsync_dir(path)

    class Announcing(LocalStore):
        def _locked(self, key: str):  # type: ignore[no-untyped-def]
            w3_waits.set()  # it wrote its new version, and now waits for the key's lock
            return super()._locked(key)

    LocalStore(tmp_path).put("m/k", b"v1-acknowledged")
    old = os.open(tmp_path / "m" / "k", os.O_RDONLY)  # the inode the disk names until W1 syncs
    try:
        w1 = threading.Thread(target=PausedBeforeFsync(tmp_path).put, args=("m/k", b"v2"))
        w1.start()
        assert paused.wait(10)
        w3_store = Announcing(tmp_path)
        current = w3_store.get("m/k")
        assert current.data == b"v2"
        w3 = threading.Thread(target=w3_store.put, args=("m/k", b"v3-newer"),
                              kwargs={"if_match": current.etag})
        w3.start()
        assert w3_waits.wait(10)
        assert os.pread(old, 64, 0) == b"v1-acknowledged"  # untouched until W1's fsync
        go.set()
        w1.join(10)
        w3.join(10)
    finally:
        go.set()
        os.close(old)
    assert LocalStore(tmp_path).get("m/k").data == b"v3-newer"
    assert content_etag(b"v2") == current.etag
    assert not [n for n in os.listdir(tmp_path / "m") if n.startswith(".icefloe-pending")]


def test_should_promote_a_pending_version_left_by_a_crash(tmp_path):
    """A crash between keeping the old version (pending) and the rename leaves it linked
    to the live key too; the next replace keeps it as the spare once its rename is durable,
    never writes into it while it is the key."""
    store = LocalStore(tmp_path)
    store.put("k", b"live")
    live_inode = os.stat(tmp_path / "k").st_ino
    os.link(tmp_path / "k", store._spare(tmp_path / "k", "pending"))
    with open(tmp_path / "k", "rb") as live:
        store.put("k", b"next")
        assert live.read() == b"live"
    assert store.get("k").data == b"next"
    assert spares(tmp_path)
    assert os.stat(store._spare(tmp_path / "k")).st_ino == live_inode
    store.put("k", b"third")  # written into the promoted spare
    assert os.stat(tmp_path / "k").st_ino == live_inode
    assert store.get("k").data == b"third"


@pytest.mark.parametrize(("errno_", "kind"), [(24, "PermanentStoreError"),
                                              (5, "TransientStoreError")])
def test_should_say_a_put_may_be_stored_when_it_fails_after_the_rename(tmp_path, errno_,
                                                                       kind):
    """A failing directory fsync comes after the new version replaced the old one: it is
    visible already, so the error must not say "not stored", whatever its kind."""
    from icefloe.errors import StoreError

    class FailingFsync(LocalStore):
        def _fsync_dir(self, path: Path) -> None:
            raise OSError(errno_, os.strerror(errno_))

    store = FailingFsync(tmp_path)
    LocalStore(tmp_path).put("k", b"old")
    with pytest.raises(StoreError) as failed:
        store.put("k", b"new")
    assert type(failed.value).__name__ == kind
    assert failed.value.ambiguous
    assert "may be stored" in str(failed.value)
    assert LocalStore(tmp_path).get("k").data == b"new"


def test_should_say_not_stored_when_a_put_fails_before_the_rename(tmp_path, monkeypatch):
    from icefloe.errors import PermanentStoreError

    LocalStore(tmp_path).put("k", b"old")
    monkeypatch.setattr(local_module.os, "fsync",
                        lambda fd: (_ for _ in ()).throw(OSError(24, "Too many open files")))
    with pytest.raises(PermanentStoreError) as failed:
        LocalStore(tmp_path).put("k", b"new")
    assert not failed.value.ambiguous
    monkeypatch.undo()
    assert LocalStore(tmp_path).get("k").data == b"old"


def test_should_not_leave_a_taken_spare_behind_when_it_cannot_be_opened(tmp_path,
                                                                        monkeypatch):
    from icefloe.errors import PermanentStoreError

    store = LocalStore(tmp_path)
    store.put("k", b"v1")
    store.put("k", b"v2")  # v1 kept as the spare
    real_open = os.open

    def no_descriptors(path, flags, *args):  # type: ignore[no-untyped-def]
        if ".icefloe-tmp-" in str(path) and flags == os.O_WRONLY:
            raise OSError(24, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(local_module.os, "open", no_descriptors)
    with pytest.raises(PermanentStoreError, match="Too many open files"):
        store.put("k", b"v3")
    monkeypatch.undo()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".icefloe-tmp")]
    assert store.get("k").data == b"v2"
