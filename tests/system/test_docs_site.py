"""The documentation site (``mkdocs.yml``, ``docs/``) builds strictly, and the README stays a
front page whose links all land.

Why a test as well as ``make test``'s build: the suite is what runs on every change
(``pytest tests/system``), and a broken link or anchor, a page left out of ``nav`` or a link
to a repository file that moved must fail it. The strict build catches those inside
``docs/`` (``validation`` in mkdocs.yml turns them into warnings, ``--strict`` into a
failure; ``scripts/mkdocs_hooks.py`` checks links that leave ``docs/``); the README is
read on GitHub, not built, so its links are checked here the same way.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")
README_MAX_LINES = 400
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks",
                                                  ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("index.html", "ingesting/index.html", "contributing/index.html",
                 "configuration/index.html", "coming-from/ondatra/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # the config reference made it onto the page, rendered as a table
    html = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "<td><code>store.url</code></td>" in html


@pytest.mark.parametrize("breakage", [
    ("cli.md", "\n[gone](streams.md#no-such-heading)\n"),
    ("cli.md", "\n[gone](no-such-page.md)\n"),
    ("deploying.md", "\n[gone](../deploy/no-such-file.md)\n"),
    ("deploying.md", "\n[gone](../deploy/README.md#no-such-heading)\n"),
])
def test_a_broken_link_fails_the_build(tmp_path: Path, breakage: tuple[str, str]) -> None:
    """The checks the build relies on do fail: a copy of the project with one bad link."""
    project = tmp_path / "project"
    project.mkdir()
    for entry in ROOT.iterdir():  # the repository as it is, but for docs/
        if entry.name not in ("docs", ".git", ".venv", "build"):
            (project / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "docs", project / "docs")
    page, text = breakage
    with (project / "docs" / page).open("a") as f:
        f.write(text)
    done = build(project, tmp_path / "site")
    assert done.returncode != 0, done.stderr
    output = done.stdout + done.stderr
    assert "WARNING" in output, output[-3000:]
    assert "no-such-" in output, output[-3000:]


def test_every_docs_page_is_in_the_nav() -> None:
    """Also enforced by the build (``omitted_files: warn``); said here by name."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if p not in nav} == set()


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    # the tour names where an HTTP event is validated, becomes a batch file, is committed
    for named in ("ingestor/validate.py", "icefloe/formats/batch.py",
                  "icefloe/manifest/publish.py", "collector/commit.py",
                  "pipeline/iceberg/commit.py"):
        assert named in text, named
        assert (ROOT / named).is_file(), named
    for name in ("CompiledStream", "publish_block", "commit_rows", "_run_once"):
        assert re.search(rf"\b(def|class) {name}\b", _source_of(text, name)), name


def _source_of(readme: str, name: str) -> str:
    """The text of every Python file the README names, for a function it names."""
    files = set(re.findall(r"`((?:icefloe|ingestor|collector|pipeline)/[\w/]+\.py)`", readme))
    return "\n".join((ROOT / f).read_text() for f in sorted(files) if (ROOT / f).is_file())


def test_every_readme_link_lands() -> None:
    anchors = hooks().github_anchors
    text = (ROOT / "README.md").read_text()
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        where = ROOT / path if path else ROOT / "README.md"
        lost = not where.exists() or (
            bool(anchor) and where.suffix == ".md" and anchor not in anchors(where))
        if lost:
            broken.append(target)
    assert broken == []
