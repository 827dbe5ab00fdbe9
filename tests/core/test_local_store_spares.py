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
