"""Store faults switched on from outside a process: how the chaos harness breaks the store.

Why an environment variable: the chaos harness runs real ``icefloe ingestor`` and
``icefloe collector`` processes and must inject store faults into them *while they run*
(bursts of 503s, slow responses, writes whose response is lost) without any test-only code
path in how they are started. With ``ICEFLOE_STORE_FAULTS=/path/faults.json`` set,
:func:`icefloe.store.open_async_store` puts a :class:`FileDrivenFaultyStore` under its retry
layer — exactly where a real store's failures arrive. The file holds::

    {"seed": 7, "rules": [{"kind": "slowdown", "probability": 0.2, "ops": ["put"],
                           "key_prefix": "", "times": null, "delay_s": [0.05, 0.2]}]}

and is re-read whenever it changes (checked at most every 0.2 s), so the harness starts and
ends a burst by rewriting it. Every injected fault is appended as one line
``<pid> <kind> <op>`` to ``faults.json.log``, so the harness can report what it injected.
Unset (the normal case), nothing is wrapped and nothing is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from icefloe.store.base import AsyncObjectStore
from icefloe.store.faults import ALL_OPS, FaultRule, FaultyAsyncStore

FAULTS_ENV = "ICEFLOE_STORE_FAULTS"
_CHECK_EVERY_S = 0.2


def rules_from_json(spec: dict[str, Any]) -> list[FaultRule]:
    """Rules from the file's ``rules`` list (unknown keys are an error: a typo must not
    silently disable a fault)."""
    rules = []
    for raw in spec.get("rules", []):
        if raw.get("layer", "store") != "store":
            continue  # e.g. "http": applied by the S3 server of a chaos run, not here
        raw = {k: v for k, v in raw.items() if k != "layer"}
        ops = frozenset(raw.pop("ops", ALL_OPS))
        delay = tuple(raw.pop("delay_s", (0.02, 0.05)))
        rules.append(FaultRule(ops=ops, delay_s=(float(delay[0]), float(delay[1])), **raw))
    return rules


class WatchedSpec:
    """The faults file, re-read only when it changed (looked at most every 0.2 s).

    Shared by the in-process store faults here and the S3 server's wire faults
    (:mod:`testing.chaos.http_faults`), which read the same file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._mtime: int | None = None
        self._checked = 0.0

    def changed(self) -> dict[str, Any] | None:
        """The new spec if the file changed since the last look (``{}`` once it is gone),
        else None. A file caught mid-write counts as unchanged and is read again shortly."""
        now = time.monotonic()
        if now - self._checked < _CHECK_EVERY_S:
            return None
        self._checked = now
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            if self._mtime is None:
                return None
            self._mtime = None
            return {}
        if mtime == self._mtime:
            return None
        try:
            spec: dict[str, Any] = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return None
        self._mtime = mtime
        return spec


class FileDrivenFaultyStore(FaultyAsyncStore):
    """A :class:`FaultyAsyncStore` whose rules come from a JSON file that may change."""

    def __init__(self, inner: AsyncObjectStore, path: str | os.PathLike[str]) -> None:
        super().__init__(inner)
        self.spec = WatchedSpec(path)
        self.log_path = Path(f"{path}.log")
        self._reload()

    def _reload(self) -> None:
        spec = self.spec.changed()
        if spec is not None:
            self.rules = rules_from_json(spec)
            self.rng.seed(f"{spec.get('seed', 0)}:{os.getpid()}")

    async def _call(self, op: str, key: str, call: Any) -> Any:
        self._reload()
        before = Counter(self.injected)
        try:
            return await super()._call(op, key, call)
        finally:
            fired = self.injected - before
            if fired:
                self._record(op, fired)

    def _record(self, op: str, fired: Counter[str]) -> None:
        lines = "".join(f"{os.getpid()} {kind} {op}\n" for kind in fired.elements())
        # OSError: the report loses a line; the fault itself still happened
        with contextlib.suppress(OSError), self.log_path.open("a") as log:
            log.write(lines)


def wrap_if_configured(inner: AsyncObjectStore) -> AsyncObjectStore:
    """``inner`` wrapped when ``ICEFLOE_STORE_FAULTS`` is set, else ``inner`` itself."""
    path = os.environ.get(FAULTS_ENV)
    return FileDrivenFaultyStore(inner, path) if path else inner
