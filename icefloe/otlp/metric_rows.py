"""A ``Metric``'s data points as rows of its kind's table (gauge, sum, histogram,
exponential histogram, summary).

Why apart from :mod:`icefloe.otlp.rows`: the five point types have five shapes, and the
rules they share (a point starts with its metric's name, description, unit and metadata
and its own times, attributes and flags; numbers keep ints exact in ``value_int``) are
written once here. A point's row repeats its metric's columns: a table has no parent rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icefloe.otlp.kinds import METRIC_KINDS
from icefloe.otlp.out import Attributes, Out
from icefloe.otlp.row_types import (
    Exemplar,
    ExponentialHistogramRow,
    GaugeRow,
    HistogramRow,
    Quantile,
    SummaryRow,
    SumRow,
)
from icefloe.otlp.values import (
    TEMPORALITIES,
    enum_name,
    finite,
    hex_of,
    long_of,
    longs_of,
    time_of,
)

Head = tuple[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]
"""A point's first ten columns: its metric's four, then its times, attributes, flags."""


def metric_rows(out: Out, metric: Any, shared: bytes, attrs: Attributes) -> None:
    """Each data point of ``metric`` as a row of its kind, onto ``out``; a metric without
    data is one rejected data point."""
    kind = metric.WhichOneof("data")
    if kind not in METRIC_KINDS:
        out.reject(f"metric {metric.name!r} has no data (none of {', '.join(METRIC_KINDS)})")
        return
    data = getattr(metric, kind)
    points = data.data_points
    if not points:
        return
    out.scope(kind, shared)
    name = metric.name
    about = (name or None, metric.description or None, metric.unit or None,
             attrs(metric.metadata))
    build = _BUILDERS[kind]
    temporality = enum_name(TEMPORALITIES, data.aggregation_temporality) \
        if kind in ("sum", "histogram", "exponential_histogram") else None
    monotonic = data.is_monotonic if kind == "sum" else None

    def row(point: Any, attrs: Attributes) -> Any:
        return build(point, _head(about, point, name, attrs), attrs, temporality, monotonic)

    out.add(row, points, attrs)


def _head(about: tuple[Any, Any, Any, Any], point: Any, name: str, attrs: Attributes
          ) -> Head:
    ns, start = point.time_unix_nano, point.start_time_unix_nano
    return (*about, time_of(ns, f"metric {name!r}: time_unix_nano"), ns,
            time_of(start, f"metric {name!r}: start_time_unix_nano"), start,
            attrs(point.attributes), point.flags)


def _number(point: Any) -> tuple[float | None, int | None]:
    """``(value, value_int)``: the double, or an int's double and its exact value."""
    which = point.WhichOneof("value")
    if which == "as_double":
        return finite(point.as_double), None
    if which == "as_int":
        number = point.as_int
        return float(number), number
    return None, None


def _exemplars(point: Any, name: str, attrs: Attributes) -> list[Exemplar]:
    found = []
    for exemplar in point.exemplars:
        ns = exemplar.time_unix_nano
        found.append(Exemplar(time_of(ns, f"metric {name!r}: exemplar time_unix_nano"), ns,
                              *_number(exemplar), hex_of(exemplar.trace_id),
                              hex_of(exemplar.span_id),
                              attrs(exemplar.filtered_attributes)))
    return found


def _gauge(point: Any, head: Head, attrs: Attributes, temporality: Any, monotonic: Any
           ) -> GaugeRow:
    return GaugeRow(*head, *_number(point),
                    _exemplars(point, head[0], attrs) if point.exemplars else [])


def _sum(point: Any, head: Head, attrs: Attributes, temporality: Any, monotonic: Any
         ) -> SumRow:
    return SumRow(*head, *_number(point),
                  _exemplars(point, head[0], attrs) if point.exemplars else [],
                  temporality, monotonic)


def _stats(point: Any, name: str) -> tuple[int, Any, Any, Any]:
    """count, sum, min, max of a histogram point (sum, min and max are optional)."""
    has = point.HasField
    return (long_of(point.count, f"metric {name!r}: count"),
            finite(point.sum) if has("sum") else None,
            finite(point.min) if has("min") else None,
            finite(point.max) if has("max") else None)


def _histogram(point: Any, head: Head, attrs: Attributes, temporality: Any, monotonic: Any
               ) -> HistogramRow:
    name = head[0]
    return HistogramRow(*head, *_stats(point, name),
                        longs_of(point.bucket_counts, f"metric {name!r}: bucket_counts"),
                        list(point.explicit_bounds), temporality,
                        _exemplars(point, name, attrs) if point.exemplars else [])


def _exponential_histogram(point: Any, head: Head, attrs: Attributes, temporality: Any,
                           monotonic: Any) -> ExponentialHistogramRow:
    name = head[0]
    positive, negative = point.positive, point.negative
    return ExponentialHistogramRow(
        *head, *_stats(point, name), point.scale,
        long_of(point.zero_count, f"metric {name!r}: zero_count"),
        finite(point.zero_threshold),
        positive.offset,
        longs_of(positive.bucket_counts, f"metric {name!r}: positive.bucket_counts"),
        negative.offset,
        longs_of(negative.bucket_counts, f"metric {name!r}: negative.bucket_counts"),
        temporality, _exemplars(point, name, attrs) if point.exemplars else [])


def _summary(point: Any, head: Head, attrs: Attributes, temporality: Any, monotonic: Any
             ) -> SummaryRow:
    return SummaryRow(*head, long_of(point.count, f"metric {head[0]!r}: count"),
                      finite(point.sum),
                      [Quantile(finite(q.quantile), finite(q.value))
                       for q in point.quantile_values])


_BUILDERS: dict[str, Callable[[Any, Head, Attributes, Any, Any], Any]] = {
    "gauge": _gauge, "sum": _sum, "histogram": _histogram,
    "exponential_histogram": _exponential_histogram, "summary": _summary}
