"""Telling ext4 without a journal from everything else, on fake /sys and /proc trees."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from ingest_support import make_config, running

import icefloe.store.fs_kind as fs_kind
from icefloe.store.fs_kind import journalless_ext4_device, journalless_note
from icefloe_app.cli import main


def fake_kernel(root: Path, directory: Path, device: str, *, ext4: bool = True,
                journals: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """/sys and /proc trees that say ``directory``'s device is ``device``."""
    st = os.stat(directory)
    block = root / "sys" / "dev" / "block"
    block.mkdir(parents=True, exist_ok=True)
    (block / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(
        f"../../devices/virtual/block/{device}")
    (root / "proc" / "fs" / "jbd2").mkdir(parents=True)
    if ext4:
        (root / "proc" / "fs" / "ext4" / device).mkdir(parents=True)
    for journal in journals:
        (root / "proc" / "fs" / "jbd2" / journal).mkdir()
    return root / "sys", root / "proc"


@pytest.mark.parametrize(("device", "ext4", "journals", "expected"), [
    ("vda", True, (), "vda"),
    ("vda", True, ("vda-8",), None),
    ("vda", True, ("vdb-8",), "vda"),  # another device's journal says nothing of this one
    ("dm-0", True, ("dm-0-8",), None),
    ("dm-0", True, ("dm-1-8",), "dm-0"),
    ("sda1", False, (), None),  # XFS, btrfs, ...: not ext4
])
def test_should_tell_a_journalless_ext4(tmp_path, device, ext4, journals, expected):
    store = tmp_path / "store"
    store.mkdir()
    sys_root, proc_root = fake_kernel(tmp_path / "k", store, device, ext4=ext4,
                                      journals=journals)
    assert journalless_ext4_device(store, sys_root=sys_root, proc_root=proc_root) == expected


def test_should_answer_unknown_rather_than_guess(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()  # no /sys/dev/block link for the device: tmpfs, a container, not Linux
    assert journalless_ext4_device(store, sys_root=empty, proc_root=empty) is None
    assert journalless_ext4_device(tmp_path / "missing") is None


def on_fake_journalless_ext4(tmp_path: Path, store: Path, monkeypatch) -> None:
    sys_root, proc_root = fake_kernel(tmp_path / "k", store, "vdz")
    monkeypatch.setattr(fs_kind, "SYS", sys_root)
    monkeypatch.setattr(fs_kind, "PROC", proc_root)


def test_probe_should_say_when_a_local_store_is_on_journalless_ext4(tmp_path, monkeypatch,
                                                                     capsys):
    store = tmp_path / "s"
    store.mkdir()
    on_fake_journalless_ext4(tmp_path, store, monkeypatch)
    assert main(["probe", "--store", store.as_uri(), "--puts", "2"]) == 0
    out = capsys.readouterr().out
    assert f"note: {store} is on ext4 without a journal (vdz)" in out
    assert journalless_note(store) in out


def test_probe_should_say_nothing_of_a_journaled_one(tmp_path, monkeypatch, capsys):
    store = tmp_path / "s"
    store.mkdir()
    sys_root, proc_root = fake_kernel(tmp_path / "k", store, "vdz", journals=("vdz-8",))
    monkeypatch.setattr(fs_kind, "SYS", sys_root)
    monkeypatch.setattr(fs_kind, "PROC", proc_root)
    assert main(["probe", "--store", store.as_uri(), "--puts", "0"]) == 0
    assert "note:" not in capsys.readouterr().out


async def test_ingestor_should_warn_once_at_start(tmp_path, monkeypatch, caplog):
    store = tmp_path / "store"
    store.mkdir()
    on_fake_journalless_ext4(tmp_path, store, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="icefloe.ingestor"):
        async with running(make_config(store)):
            pass
    warnings = [r.getMessage() for r in caplog.records if "without a journal" in r.getMessage()]
    assert warnings == [f"local store: {journalless_note(store)}"]
