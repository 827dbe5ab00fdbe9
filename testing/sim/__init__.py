"""A deterministic simulator of the whole icefloe protocol (issue #22).

One seed drives configuration, producers, collectors, registry changes, maintenance and
store faults on a virtual clock; invariants are checked after every commit and at the end.
See ``docs/simulator.md``. Run one seed with ``make sim SEED=N``, many with
``make sim SEEDS=N``.
"""
