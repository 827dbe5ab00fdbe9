"""Write constraints.txt: the exact version of every distribution ``icefloe[all]`` installs.

Why: pyproject gives ranges (a library must not over-pin its users), but the image must
install what the test suite ran against, so the Dockerfile installs with ``-c
constraints.txt``. The versions come from the environment this runs in (``.venv``, where
``make`` installed ``.[all,dev]`` and the tests pass): the closure of icefloe's runtime
requirements with their extras, development tools left out.

    .venv/bin/python scripts/constraints.py            # rewrite constraints.txt
    .venv/bin/python scripts/constraints.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "constraints.txt"
HEADER = (
    "# Exact versions of everything `pip install 'icefloe[all]'` installs, as tested.\n"
    "# Written by scripts/constraints.py from .venv; the Dockerfile installs with -c.\n"
)


def project_requirements(extras: frozenset[str] = frozenset({"all"})) -> list[Requirement]:
    """icefloe's own requirements with ``extras``, read from pyproject.toml (not from the
    installed metadata, which may be an older checkout's), self-references expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out: list[Requirement] = [Requirement(text) for text in project["dependencies"]]
    todo, done = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in done:
            continue
        done.add(extra)
        for text in optional.get(extra, []):
            req = Requirement(text)
            if canonicalize_name(req.name) == project["name"]:
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def closure(extras: frozenset[str] = frozenset({"all"})) -> dict[str, str]:
    """Every distribution ``icefloe[extras]`` pulls in, name -> version installed here."""
    found: dict[str, str] = {}
    todo = [(canonicalize_name(r.name), frozenset(r.extras))
            for r in project_requirements(extras) if _applies(r, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        dist = metadata.distribution(name)
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if _applies(req, wanted):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return found


def _applies(req: Requirement, extras: frozenset[str]) -> bool:
    """Whether ``req`` is needed on this interpreter with these extras of its parent."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": extra}) for extra in extras | {""})


def render(pins: dict[str, str]) -> str:
    """The file's text: the header, then ``name==version`` lines sorted by name."""
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when constraints.txt differs")
    args = parser.parse_args(argv)
    text = render(closure())
    if args.check:
        if OUT.read_text() != text:
            print("constraints.txt is stale: run scripts/constraints.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
