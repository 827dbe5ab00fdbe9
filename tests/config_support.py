"""Writing an ``icefloe.toml`` for the config tests: one file name, one store and catalog
header, one way to load it without the process environment.

Why shared: the config tests each describe a different part of the file (streams, layout,
types, upserts, ``where``), but all of them need the same ``[store]`` and ``[catalog]``
sections in front and must not read ``ICEFLOE_*`` variables from the machine running them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from icefloe.config import Config, load_config

HEADER = textwrap.dedent("""
    [store]
    url = "file:///var/lib/icefloe/store"
    [catalog]
    uri = "sqlite:////var/lib/icefloe/catalog.db"
    warehouse = "file:///var/lib/icefloe/warehouse"
""")
"""The ``[store]`` and ``[catalog]`` sections of a config on absolute local paths."""


def write_config(directory: Path, text: str) -> Path:
    """``text`` as ``directory/icefloe.toml``; its path."""
    path = directory / "icefloe.toml"
    path.write_text(text)
    return path


def load_text(directory: Path, text: str) -> Config:
    """Write ``text`` as the config file and load it, ignoring the environment."""
    return load_config(write_config(directory, text), env={})
