"""The reference parts of the docs (docs/configuration.md) are checked against the code they
describe, and the README starts with the two commands."""

from __future__ import annotations

from pathlib import Path

from icefloe.config.reference import MEANING, SECTIONS, markdown, readme_block

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def test_should_describe_every_setting():
    keys = {f"{section}.{field}" for section, struct in SECTIONS.items()
            for field in struct.__struct_fields__}
    assert keys - set(MEANING) == set(), "settings without a description in MEANING"
    assert set(MEANING) - keys == set(), "descriptions of settings that do not exist"


def test_should_keep_the_readme_reference_in_sync():
    block = readme_block(CONFIGURATION.read_text())
    assert block is not None, "docs/configuration.md lost its config-reference markers"
    assert block == markdown(), "stale: run `.venv/bin/python scripts/sync-config-reference.py`"


def test_should_start_the_readme_with_the_two_commands():
    text = README.read_text()
    first = text[:text.index("## ")]
    assert "make up" in first
    assert "make test" in first


def test_should_list_every_stream_key_in_the_configuration_page():
    """The stream keys are documented by hand (the generated block covers the sections):
    a key added to ``StreamConfig`` without a row here is a page that lies by omission."""
    import msgspec

    from icefloe.config import StreamConfig

    text = CONFIGURATION.read_text()
    start = text.index("**Stream keys**")
    rows = text[start:text.index("\n\n", text.index("| key |", start))]
    listed = {line.split("`")[1] for line in rows.splitlines() if line.startswith("| `")}
    keys = {f.encode_name for f in msgspec.structs.fields(StreamConfig)}
    assert keys - listed == set(), "stream keys missing from docs/configuration.md's table"
    assert listed - keys == set(), "rows for stream keys that do not exist"
