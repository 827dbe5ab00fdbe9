"""Helpers for the packaging and image tests: wheels, clean virtualenvs, an import blocker.

Why clean virtualenvs: the development ``.venv`` has every extra installed, so only a fresh
environment shows what ``pip install icefloe`` (or ``icefloe[ingestor]``) really brings.
pip's own cache (``~/.cache/pip``) keeps the downloads, so a second run installs offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"

HEAVY = ("pyspark", "pyarrow", "pyiceberg", "pandas", "numpy")
"""What a light client and a slim ingestor must never load."""

BLOCKER = """\
import importlib.abc, sys

class _Blocked(importlib.abc.MetaPathFinder):
    # refuses the named top-level modules, as if they were not installed
    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, _Blocked(sys.argv.pop(1).split(",")))
sys.argv[0] = "icefloe"
from icefloe_app.cli import main
sys.exit(main())
"""
"""``python -c BLOCKER NAMES ARGS...``: run the icefloe CLI with the comma-separated top-level
modules NAMES made unimportable, so importing any of them fails loudly."""


def quiet_env(**extra: str) -> dict[str, str]:
    """The environment for child pythons: no ICEFLOE_* settings from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env.update(PYTHONUNBUFFERED="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def build_wheel(source: Path, out: Path) -> Path:
    """The icefloe wheel built from the tree at ``source`` (offline: hatchling is a test
    dependency, so no isolated build environment is downloaded)."""
    out.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                             "--no-build-isolation", "-w", str(out), str(source)],
                            check=False, capture_output=True, text=True, env=quiet_env())
    if result.returncode != 0:
        raise AssertionError(f"building the wheel from {source} failed:\n"
                             f"{result.stderr[-3000:]}")
    (wheel,) = out.glob("icefloe-*.whl")
    return wheel


@dataclass(frozen=True)
class Venv:
    """A virtualenv made for one test, and how long its install took."""

    path: Path
    install_s: float

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def icefloe(self) -> str:
        return str(self.path / "bin" / "icefloe")

    def installed(self) -> set[str]:
        """The distribution names installed (lower case)."""
        out = subprocess.run([self.python, "-c", "import importlib.metadata as m, json; "
                              "print(json.dumps([d.metadata['Name'] for d in "
                              "m.distributions()]))"],
                             check=True, capture_output=True, text=True)
        return {name.lower() for name in json.loads(out.stdout)}

    def size_mib(self) -> float:
        """Installed size, what ``du`` says (pip and setuptools of the venv included)."""
        total = sum(p.stat().st_size for p in self.path.rglob("*")
                    if p.is_file() and not p.is_symlink())
        return total / 2**20


def make_venv(path: Path, requirement: str) -> Venv:
    """A fresh virtualenv at ``path`` with ``requirement`` installed under constraints.txt."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    started = time.monotonic()
    result = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet",
                             "-c", str(CONSTRAINTS), requirement],
                            capture_output=True, text=True, env=quiet_env(), check=False)
    took = time.monotonic() - started
    if result.returncode != 0:
        raise AssertionError(f"pip install {requirement} failed:\n{result.stderr[-3000:]}")
    return Venv(path, took)


def copy_tree(source: Path, dest: Path, files: set[str]) -> None:
    """Copy the relative paths ``files`` (files only) from ``source`` to ``dest``."""
    for rel in sorted(files):
        src = source / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
