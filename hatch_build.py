"""Wheel build hook: tag the wheel for the platform when the compiled loops are inside.

``scripts/build_speedups.py`` compiles ``icefloe/formats/_speedups.pyx`` into an extension
module for one interpreter and platform. A wheel that carries it but says ``py3-none-any``
would install on any Python and then silently fall back to the slower path (or fail to load
the module), so with the ``.so`` present the wheel takes the running interpreter's tag;
without it icefloe is pure Python and stays ``py3-none-any``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class SpeedupsTagHook(BuildHookInterface):  # type: ignore[type-arg]
    """Marks the wheel impure (and lets hatchling infer its tag) when the loops are built."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Called by hatchling before it builds; ``build_data`` sets the wheel's tag."""
        if self.target_name != "wheel" or version == "editable":
            return
        if any(Path(self.root, "icefloe", "formats").glob("_speedups*.so")):
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
