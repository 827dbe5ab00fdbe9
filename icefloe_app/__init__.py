"""The composition root: the one package that imports every part of icefloe.

The core (``icefloe``) and the roles (``ingestor``, ``collector``, ``pipeline``) never
import from here; this package wires them together for people and operators:

- :mod:`icefloe_app.cli`: the ``icefloe`` command (``up``, ``ingestor``, ``collector``,
  ``admin``, the table and registry tools);
- :mod:`icefloe_app.api`: the admin API (sources, sinks, tokens and their tasks).

Why a separate top-level package: the command and the admin API need every layer, so
they sit above all of them; keeping them out of ``icefloe`` lets the core stay the bottom
layer (``tests/system/test_layers.py`` checks it).
"""

__all__: list[str] = []
