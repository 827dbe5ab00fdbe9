"""``python -m icefloe`` runs the CLI (same as the ``icefloe`` console script).

A thin shim over :mod:`icefloe_app.cli`, the composition root: the only module of the
core allowed to import above it (``tests/system/test_layers.py`` names this exemption).
"""

import sys

from icefloe_app.cli import main

sys.exit(main())
