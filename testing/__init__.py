"""Test and simulation tools: never shipped in the wheel, imported only by tests and bench."""
