"""The README's reference parts are checked against the code they describe."""

from __future__ import annotations

from pathlib import Path

from icefloe.config.reference import MEANING, SECTIONS, markdown, readme_block

README = Path(__file__).resolve().parents[2] / "README.md"


def test_should_describe_every_setting():
    keys = {f"{section}.{field}" for section, struct in SECTIONS.items()
            for field in struct.__struct_fields__}
    assert keys - set(MEANING) == set(), "settings without a description in MEANING"
    assert set(MEANING) - keys == set(), "descriptions of settings that do not exist"


def test_should_keep_the_readme_reference_in_sync():
    block = readme_block(README.read_text())
    assert block is not None, "README lost its config-reference markers"
    assert block == markdown(), "stale: run `.venv/bin/python scripts/sync-config-reference.py`"


def test_should_start_the_readme_with_the_two_commands():
    text = README.read_text()
    first = text[:text.index("## ")]
    assert "make up" in first
    assert "make test" in first
