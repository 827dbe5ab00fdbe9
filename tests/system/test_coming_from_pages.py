"""The "Coming from …" pages (#37): each system's mapping table, one row per thing its users
type, and every row names the tests that check it. Those tests must exist, so a row cannot
quietly lose its proof (a renamed or deleted test fails here), and each page's table is
read the way a user reads it: the first cell is what they typed, the second what it is here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("ondatra.md", "moose.md", "opendata.md", "keboola.md")
_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def table_rows(page: str) -> list[list[str]]:
    """The mapping table's body rows (cells stripped), header and rule left out."""
    text = (ROOT / "docs" / "coming-from" / page).read_text()
    start = text.index("## Mapping")
    rows = [line for line in text[start:].splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[1:] == ["icefloe", "tested by"], header
    return [[c.strip() for c in row.strip().strip("|").split(" | ")] for row in rows[2:]]


@pytest.mark.parametrize("page", PAGES)
def test_every_row_names_tests_that_exist(page: str) -> None:
    rows = table_rows(page)
    assert len(rows) >= 5
    for row in rows:
        assert len(row) == 3, row
        refs = _REF.findall(row[2])
        assert refs, f"{page}: row {row[0]!r} names no test"
        for path, name in refs:
            source = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.M), \
                f"{page}: row {row[0]!r}: {path}::{name} does not exist"


@pytest.mark.parametrize("page", PAGES)
def test_the_readme_links_the_page(page: str) -> None:
    assert f"(docs/coming-from/{page})" in (ROOT / "README.md").read_text()


def test_ondatra_page_runs_the_example_folder_it_describes() -> None:
    text = (ROOT / "docs" / "coming-from" / "ondatra.md").read_text()
    example = (ROOT / "examples" / "ondatra" / "models" / "raw" / "events.sql").read_text()
    assert "cd examples/ondatra" in text
    assert example.splitlines()[1] == "-- @kind: events"
    for typed in ("COLLECT_PORT=8080", "/collect/raw/events/batch", "icefloe run"):
        assert typed in text


def test_settings_named_in_the_pages_exist() -> None:
    """``on_invalid``, ``payload`` and ``batch_compression`` as the pages spell them."""
    from icefloe.config import IngestorSection, StreamConfig

    assert {"on_invalid", "payload"} <= set(StreamConfig.__struct_fields__)
    assert "batch_compression" in IngestorSection.__struct_fields__
    moose = (ROOT / "docs" / "coming-from" / "moose.md").read_text()
    opendata = (ROOT / "docs" / "coming-from" / "opendata.md").read_text()
    assert 'on_invalid = "dead_letter"' in moose
    assert 'payload = "bytes"' in opendata
    assert 'batch_compression = "zstd"' in opendata
