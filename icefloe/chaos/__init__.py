"""The chaos harness: a real cluster under load, crashes and store faults, then a proof
that every acknowledged event landed exactly once (``icefloe-chaos``, ``make chaos``)."""
