"""Argparse types for numeric flags: a value that does not fit is argparse's usage error
(exit 2, one line naming the flag), never a default taken instead or a loop without end."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole_number(flag: str, zero: str = "") -> Callable[[str], int]:
    """A whole number, 0 or more; ``zero`` says what 0 means (``"all rows"``), if anything
    special."""
    said = f" ({zero})" if zero else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a whole number, not {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{flag} must be 0{said} or more, not {value}")
        return value
    return parse


def positive_seconds(flag: str) -> Callable[[str], float]:
    """A finite number of seconds above 0 (0 would mean "no wait": a busy loop)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a number of seconds, not {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(
                f"{flag} must be a number of seconds above 0, not {text}")
        return value
    return parse
