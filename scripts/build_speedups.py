"""Build icefloe's compiled hot loops in place, with Cython: ``icefloe/formats/_speedups.pyx``
(framing, Kafka records) and ``icefloe/otlp/_wire.pyx`` (OTLP requests to rows).

Run by ``make`` after installing the virtualenv. Where no C compiler is found it says so
and exits 0: icefloe then runs its pure-Python reference code (same results, slower). A
compiler that fails on the source is an error (exit 1): a broken build must not pass
silently as "not built".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"icefloe.formats._speedups": ROOT / "icefloe" / "formats" / "_speedups.pyx",
           "icefloe.otlp._wire": ROOT / "icefloe" / "otlp" / "_wire.pyx"}
"""Each compiled module and its source (which may include ``.pxi`` parts beside it; the
Makefile's speedups stamp depends on them all)."""


_BUILD = """
import sys, tempfile
from Cython.Build import cythonize
from setuptools import Distribution, Extension

pairs = zip(sys.argv[1::2], sys.argv[2::2], strict=True)
with tempfile.TemporaryDirectory(prefix="icefloe-build-") as temp:
    modules = cythonize([Extension(name, [source]) for name, source in pairs], build_dir=temp,
                        compiler_directives={"language_level": 3}, quiet=True)
    dist = Distribution({"name": "icefloe-speedups", "ext_modules": modules})
    build = dist.get_command_obj("build_ext")
    build.inplace, build.build_temp, build.build_lib = True, temp, temp
    dist.run_command("build_ext")
"""
"""The build itself (setuptools' build_ext with the module given directly: the project's
own pyproject.toml is for hatchling and must not be read here)."""


def compiler() -> str | None:
    """The C compiler Python's build would use, if it is installed."""
    configured = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(configured) or shutil.which("cc") or shutil.which("gcc")


def main() -> int:
    if compiler() is None:
        print("icefloe: no C compiler found; running without the compiled speedups "
              "(pure Python, slower). Install gcc and run `make` again to build them.",
              file=sys.stderr)
        return 0
    try:
        import Cython  # noqa: F401
    except ImportError:
        print("icefloe: Cython is not installed in this environment; running without the "
              "compiled speedups (pip install 'cython>=3.0,<4', then `make` again)",
              file=sys.stderr)
        return 0
    # in a child process: a compiler's crash or a half-written module stays out of ours
    pairs = [part for name, source in SOURCES.items() for part in (name, str(source))]
    result = subprocess.run([sys.executable, "-c", _BUILD, *pairs], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(result.stdout + result.stderr, file=sys.stderr)
        names = ", ".join(source.name for source in SOURCES.values())
        print(f"icefloe: building {names} failed (exit {result.returncode}); see above",
              file=sys.stderr)
        return 1
    for source in SOURCES.values():
        built = sorted(source.parent.glob(f"{source.stem}*.so"))
        print(f"icefloe: built {built[-1].relative_to(ROOT) if built else source.stem} "
              "(compiled hot loops)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
