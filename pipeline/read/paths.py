"""Where a table's file lives on this machine, if it does (stdlib only: the cold query path
imports this before it knows whether pyiceberg is needed at all)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit


def local_path(location: str) -> str | None:
    """The local path of ``location`` (a bare path or ``file:`` URI), else None. Paths
    mean what they mean to pyiceberg's pyarrow FileIO: ``file://host/p`` is ``host/p``, a
    bare path is made absolute, nothing is unquoted."""
    if "://" not in location and not location.startswith("file:"):
        return os.path.abspath(location)
    parts = urlsplit(location)
    if parts.scheme != "file":
        return None
    return f"{parts.netloc}{parts.path}"
