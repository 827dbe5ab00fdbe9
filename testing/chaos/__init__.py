"""The chaos harness: a real cluster under load, crashes and store faults, then a proof
that every acknowledged event landed exactly once (``make chaos``, ``python -m testing.chaos``).

Test tooling, not product: it lives beside the simulator in ``testing/``, is imported only by
``tests/`` and ``bench/``, and is not in the wheel.
"""
