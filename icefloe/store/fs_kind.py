"""Is a local store's directory on ext4 without a journal? Said once, where users look.

Why it is worth saying: on ext4 without a journal the kernel's inode allocator skips every
inode of a block group freed in the last 60 s (300 s while the inode table block is dirty),
one buffer-cache lookup apiece (``recently_deleted`` in ``fs/ext4/ialloc.c``). A store
beside directories where many files were just deleted then pays for each new batch file,
and every flush creates one: on this project's VM it was most of the gap between the durable
gRPC row and the bare stack. A journaled ext4, XFS or tmpfs does not skip freed inodes.

How: the directory's device (``st_dev``) names a block device under ``/sys/dev/block``;
ext4 lists each mounted device under ``/proc/fs/ext4`` and jbd2 lists each journal under
``/proc/fs/jbd2`` as ``<device>-<journal inode>``. Linux only; anything unreadable answers
"unknown" (None), never a guess.
"""

from __future__ import annotations

import os
from pathlib import Path

SYS = Path("/sys")
PROC = Path("/proc")


def journalless_ext4_device(directory: str | os.PathLike[str], *,
                            sys_root: Path | None = None,
                            proc_root: Path | None = None) -> str | None:
    """The block device's name (``vda``) when ``directory`` is on ext4 mounted without a
    journal; None when it has one, is another file system, or cannot be told. The roots
    default to :data:`SYS` and :data:`PROC`, read at each call."""
    sys_root, proc_root = sys_root or SYS, proc_root or PROC
    try:
        st = os.stat(directory)
        link = sys_root / "dev" / "block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        device = Path(os.readlink(link)).name
        if not (proc_root / "fs" / "ext4" / device).is_dir():
            return None  # not ext4 (or not a block device at all: tmpfs, overlay, NFS)
        journals = proc_root / "fs" / "jbd2"
        has_journal = journals.is_dir() and any(
            entry.name.rsplit("-", 1)[0] == device for entry in journals.iterdir())
    except OSError:
        return None
    return None if has_journal else device


def journalless_note(directory: str | os.PathLike[str]) -> str | None:
    """One line for a user, or None: what :func:`journalless_ext4_device` found means."""
    device = journalless_ext4_device(directory)
    if device is None:
        return None
    return (f"{directory} is on ext4 without a journal ({device}): there creating a file "
            "skips every inode freed nearby in the last minutes, so each flush's batch file "
            "costs more after many deletions (see docs/sizing.md); a journaled file system "
            "does not")
