"""``--config`` and ``--data-dir``: how every command finds its configuration.

Why one helper: every command must find the same store and catalog from the same folder —
``icefloe up`` writes under ``./icefloe-data`` and ``icefloe query`` run next to it must
read exactly that. The rules, in order:

* the config file is ``--config``, else ``$ICEFLOE_CONFIG``, else ``./icefloe.toml``, else
  (for ``icefloe up`` only) the bundled ``examples/icefloe.toml``;
* settings follow flag > ``ICEFLOE_<SECTION>_<KEY>`` environment > file > default;
* ``--data-dir`` (default ``./icefloe-data``, relative to the working directory) holds the
  store, the SQLite catalog and the warehouse, but only where neither the file nor the
  environment names them.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from icefloe.config import Config, find_config, load_config

DEFAULT_DATA_DIR = "./icefloe-data"
DATA_DIR_ENV = "ICEFLOE_DATA_DIR"
# In a checkout the example lives in examples/; wheels carry it inside the package.
_EXAMPLES = (Path(__file__).resolve().parents[1] / "examples" / "icefloe.toml",
             Path(__file__).resolve().parents[2] / "examples" / "icefloe.toml")
EXAMPLE_CONFIG = next((p for p in _EXAMPLES if p.exists()), _EXAMPLES[-1])


def add_config_arguments(parser: argparse.ArgumentParser, *, example: bool = False) -> None:
    """``--config FILE`` and ``--data-dir DIR`` with help that states the lookup order."""
    fallback = ", then examples/icefloe.toml" if example else ""
    parser.add_argument("--config", metavar="FILE",
                        help=f"config file (default: $ICEFLOE_CONFIG, then ./icefloe.toml"
                             f"{fallback})")
    parser.add_argument("--data-dir", metavar="DIR", default=None,
                        help="holds the store, the SQLite catalog and the warehouse where "
                             "the config does not name them (default: $ICEFLOE_DATA_DIR, "
                             f"then {DEFAULT_DATA_DIR})")


def user_named(path: Path | None, section: str, key: str, env: Mapping[str, str]) -> bool:
    """Whether the user chose ``section.key`` (file or environment): --data-dir leaves it."""
    if f"ICEFLOE_{section.upper()}_{key.upper()}" in env:
        return True
    if path is None or not path.exists():
        return False  # load_config reports a missing file
    try:
        with path.open("rb") as handle:
            return key in tomllib.load(handle).get(section, {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False  # load_config reports it with the file's name


def data_dir_defaults(path: Path | None, data_dir: Path,
                      env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Store/catalog/warehouse under ``data_dir`` for each one the user did not name."""
    overrides: dict[str, dict[str, Any]] = {}
    if not user_named(path, "store", "url", env):
        overrides["store"] = {"url": (data_dir / "store").as_uri()}
    catalog: dict[str, Any] = {}
    if not user_named(path, "catalog", "uri", env) \
            and not user_named(path, "catalog", "type", env):
        catalog["uri"] = f"sqlite:///{data_dir / 'catalog.db'}"
    if not user_named(path, "catalog", "warehouse", env):
        catalog["warehouse"] = (data_dir / "warehouse").as_uri()
    if catalog:
        overrides["catalog"] = catalog
    return overrides


def config_path(args: argparse.Namespace, env: Mapping[str, str] = os.environ, *,
                example: bool = False) -> Path | None:
    """The config file this command reads (None: defaults and environment only)."""
    path = find_config(getattr(args, "config", None), env)
    if path is None and example:
        path = EXAMPLE_CONFIG
    return path


def data_dir_of(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Path:
    """``--data-dir``, else ``$ICEFLOE_DATA_DIR``, else ``./icefloe-data``; absolute."""
    return Path(getattr(args, "data_dir", None) or env.get(DATA_DIR_ENV)
                or DEFAULT_DATA_DIR).absolute()


def config_from_args(args: argparse.Namespace,
                     overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
                     env: Mapping[str, str] = os.environ,
                     example: bool = False) -> tuple[Path | None, Config]:
    """The config file used and the config, with --data-dir defaults and flags applied."""
    path = config_path(args, env, example=example)
    merged = data_dir_defaults(path, data_dir_of(args, env), env)
    for section, values in (overrides or {}).items():
        merged.setdefault(section, {}).update(values)
    return path, load_config(path, env=env, overrides=merged)
