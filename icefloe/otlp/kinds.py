"""The kinds of rows OTLP data becomes, and which signal carries which.

Why seven kinds and not three signals: a table has one schema, and the five metric point
types have different shapes (a gauge point is a number, a histogram point buckets), so each
point type gets its own stream and table. Every other module of :mod:`icefloe.otlp` and the
receivers key their work by these names.
"""

from __future__ import annotations

KINDS: tuple[str, ...] = ("logs", "spans", "gauge", "sum", "histogram",
                          "exponential_histogram", "summary")
"""Every kind of row, in the order tables and docs list them."""

METRIC_KINDS: tuple[str, ...] = ("gauge", "sum", "histogram", "exponential_histogram",
                                 "summary")
"""The kinds a ``Metric`` becomes: the name of the ``data`` oneof member it sets."""

SIGNALS: tuple[str, ...] = ("logs", "traces", "metrics")
"""OTLP's signals, as its HTTP paths name them (``/v1/logs``, ``/v1/traces``, ...)."""

SIGNAL_KINDS: dict[str, tuple[str, ...]] = {"logs": ("logs",), "traces": ("spans",),
                                            "metrics": METRIC_KINDS}
"""The kinds of rows each signal's export request may hold."""
