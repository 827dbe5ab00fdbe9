"""The type check of the shipped packages and the benchmarks passes: ``mypy`` with the
project's configuration (``[tool.mypy]`` in pyproject.toml: strict for ``icefloe/``, the
default checks plus ``check_untyped_defs``, ``warn_unused_ignores`` and
``warn_redundant_casts`` for the roles and ``bench/``).
``make test`` runs it before pytest too; this test makes a plain ``pytest`` catch it.

Cost: mypy keeps its cache in ``.mypy_cache/`` (gitignored), so a run after a small change
takes 1-2 s (and in ``make test`` the Makefile's run has warmed it); a cold one (fresh
checkout, or a new mypy) about 25 s of CPU, 55-70 s measured on the shared 2-core machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("icefloe", "icefloe_app", "ingestor", "collector", "pipeline")
CHECKED = (*SHIPPED, "bench", "testing")
"""The benchmarks and the test harnesses (simulator, chaos, proxies) too: they reach into the
packages' insides, and a simulator mutant that no longer fits what it patches proves nothing."""


def test_mypy_passes_on_the_shipped_packages() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout


def test_mypy_checks_every_shipped_package_strict_for_the_core() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert tuple(config["files"]) == CHECKED
    assert config["warn_unused_ignores"]
    assert config["warn_redundant_casts"]
    assert config["check_untyped_defs"]
    core = next(o for o in config["overrides"] if o["module"] == "icefloe.*")
    assert core["disallow_untyped_defs"]
    assert core["warn_return_any"]


def test_every_type_ignore_names_its_error_code() -> None:
    bare = [f"{path.relative_to(ROOT)}:{number}"
            for package in CHECKED for path in sorted((ROOT / package).rglob("*.py"))
            if "v1" not in path.relative_to(ROOT).parts
            for number, line in enumerate(path.read_text().splitlines(), start=1)
            if re.search(r"#\s*type:\s*ignore(?!\[)", line)]
    assert not bare, f"a `# type: ignore` without its [error-code]: {bare}"
