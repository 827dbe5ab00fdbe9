"""Paste the generated configuration reference into docs/configuration.md (between its
markers)."""

from pathlib import Path

from icefloe.config.reference import markdown

START = "<!-- config-reference:start"
END = "<!-- config-reference:end -->"

readme = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
text = readme.read_text()
begin, end = text.index(START), text.index(END) + len(END)
readme.write_text(text[:begin] + markdown().strip() + text[end:])
