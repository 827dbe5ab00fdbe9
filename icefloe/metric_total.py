"""Read a Prometheus metric's total in-process (for progress lines, not for scraping)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge


def metric_total(metric: Counter | Gauge) -> float:
    """The sum of a metric's value over all its label sets."""
    return sum(sample.value for family in metric.collect() for sample in family.samples
               if not sample.name.endswith("_created"))
