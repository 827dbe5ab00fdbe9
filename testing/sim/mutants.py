"""Known-broken variants of icefloe, to prove the simulator finds what it claims to find.

Each mutant undoes one fix of issue #22 (or breaks one guarantee on purpose) by patching a
single function for the duration of a run. ``python -m testing.sim --mutant NAME --seeds
N`` must then report violations; ``tests/system/test_sim.py`` pins a seed per mutant. A mutant the
simulator cannot catch is a gap in the simulator, and ``docs/simulator.md`` says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def _patch(target: Any, name: str, value: Any) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        original = getattr(target, name)
        setattr(target, name, value)
        try:
            yield
        finally:
            setattr(target, name, original)
    return patched()


def _dedup_per_table() -> contextlib.AbstractContextManager[None]:
    """Case 3 undone: an id seen from any source counts as seen (one window per table)."""
    from collector.dedup import DedupWindow

    def seen(self: DedupWindow, source: str, event_id: str) -> bool:
        return any(event_id in ids for ids in self.seen.values())
    return _patch(DedupWindow, "_seen", seen)


def _dedup_from_now() -> contextlib.AbstractContextManager[None]:
    """The window measured from now, not from the oldest waiting event (seed 2's find)."""
    from collector.dedup import DedupWindow
    return _patch(DedupWindow, "edge_s", lambda self, now: now)


def _no_dedup() -> contextlib.AbstractContextManager[None]:
    """No deduplication at all: client retries must show up as duplicates."""
    from collector.dedup import DedupWindow
    return _patch(DedupWindow, "_keep", lambda self, ids, sources: None)


def _no_fence() -> contextlib.AbstractContextManager[None]:
    """Case 6 undone: a takeover does not fence the tables."""
    from collector.service import Collector
    return _patch(Collector, "fence_tables", lambda self: None)


def _no_staging_claim() -> contextlib.AbstractContextManager[None]:
    """Case 5 undone: staging states are not stamped at takeover, and a state a collector
    creates is relied on without confirming the manifest epoch first."""
    from collector.staging import StagingArea

    async def claim_existing(self: StagingArea, epoch: int) -> int:
        return 0

    original_init = StagingArea.__init__

    def init(self: StagingArea, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **{**kwargs, "confirm": None})

    stack = contextlib.ExitStack()
    stack.enter_context(_patch(StagingArea, "claim_existing", claim_existing))
    stack.enter_context(_patch(StagingArea, "__init__", init))
    return stack


def _cluster_unrouted() -> contextlib.AbstractContextManager[None]:
    """Case 2 undone: cluster runs are neither cut where routing changes nor handed to the
    embedded path when the cluster path cannot write them (the refusal loops forever)."""
    from collector.service import Collector
    return _patch(Collector, "_route_run", lambda self, entries: (entries, self.engine.run))


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "dedup-per-table": _dedup_per_table,
    "dedup-from-now": _dedup_from_now,
    "no-dedup": _no_dedup,
    "no-fence": _no_fence,
    "no-staging-claim": _no_staging_claim,
    "cluster-unrouted": _cluster_unrouted,
}


def applied(name: str | None) -> contextlib.AbstractContextManager[None]:
    if name is None:
        return contextlib.nullcontext()
    if name not in MUTANTS:
        raise SystemExit(f"unknown mutant {name!r} (known: {', '.join(sorted(MUTANTS))})")
    return MUTANTS[name]()
