"""``python -m icefloe`` runs the CLI (same as the ``icefloe`` console script)."""

import sys

from icefloe.cli import main

sys.exit(main())
