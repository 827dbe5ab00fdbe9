"""MkDocs hooks (``hooks:`` in mkdocs.yml): links from docs/ to files of the repository
outside docs/ (``../deploy/README.md``, ``../bench/README.md#...``).

Why: those files are read on GitHub beside the code and are not part of the site, so
MkDocs cannot resolve them and would warn (which ``--strict`` turns into a failure) even
when they exist, or, told to ignore them, would let a link to a file that was moved or
deleted pass. This hook checks that each such target exists (a missing one is a warning,
so the strict build fails) and renders it as the repository path it names, since the
site has no copy of it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.icefloe")

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(((?:\.\./)+[^)#\s]+)(#[^)\s]*)?\)")
_FENCE = re.compile(r"^(```|~~~)")


def _outside(page_src: str, target: str, docs_dir: Path) -> Path | None:
    """The repository file ``target`` names from ``page_src``, if it lies outside docs/."""
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_src), target))
    if not joined.startswith("../"):
        return None
    return Path(os.path.normpath(docs_dir / joined))  # no resolve: keep symlinked paths


def github_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of the Markdown file ``path`` (where these
    links are followed: the file is read on GitHub, not on the site)."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not fenced:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
            found.update(f"{slug}-{n}" for n in range(1, 4))
    return found


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    out, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        if not fenced:
            line = _LINK.sub(lambda m: _render(m, page.file.src_uri, docs_dir, root), line)
        out.append(line)
    return "\n".join(out)


def _render(match: re.Match[str], src: str, docs_dir: Path, root: Path) -> str:
    text, target, anchor = match.group(1), match.group(2), match.group(3) or ""
    path = _outside(src, target, docs_dir)
    if path is None:
        return match.group(0)
    if not path.exists():
        log.warning("Doc file '%s' links to '%s', which does not exist in the repository",
                    src, target)
        return match.group(0)
    if anchor and path.suffix == ".md" and anchor[1:] not in github_anchors(path):
        log.warning("Doc file '%s' links to '%s%s', but that file has no heading with "
                    "that anchor", src, target, anchor)
    where = path.relative_to(root).as_posix() + anchor
    return text if text.strip("`") == where else f"{text} (repository file `{where}`)"
