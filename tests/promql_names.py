"""What a PromQL expression names, and what icefloe's processes export.

Why a small tokenizer instead of a PromQL parser: the checks only need the metric names and
label matchers an expression uses, and a tokenizer that knows PromQL's keywords, functions
and bracketed parts finds them without another dependency. It also refuses unbalanced
brackets and unknown functions, the typos a hand-edited table is most likely to carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

FUNCTIONS = frozenset((
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta",
    "deriv", "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction",
    "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum", "hour",
    "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log10", "log2",
    "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort",
    "sort_desc", "sqrt", "time", "timestamp", "vector", "year", "avg_over_time",
    "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
    "present_over_time",
))
AGGREGATIONS = frozenset((
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
))
KEYWORDS = frozenset((
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset",
))
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"\"\s*")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class PromQLError(ValueError):
    """The expression is not something the tokenizer can read as PromQL."""


@dataclass
class Names:
    """Metric names an expression selects, with the label names matched on each."""

    metrics: set[str] = field(default_factory=set)
    labels: dict[str, set[str]] = field(default_factory=dict)
    grouping: set[str] = field(default_factory=set)


def names(expr: str) -> Names:
    """The metric names, selector labels and grouping labels of one PromQL expression."""
    if expr.count("(") != expr.count(")") or expr.count("{") != expr.count("}") or \
            expr.count("[") != expr.count("]"):
        raise PromQLError(f"unbalanced brackets in {expr!r}")
    found = Names()
    text = _STRING.sub('""', expr)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges and subqueries: [5m], [1h:1m]
    for match in _GROUPING.finditer(text):
        found.grouping |= {label.strip() for label in match.group(2).split(",") if label.strip()}
    text = _GROUPING.sub(r" \1 ", text)

    def selector(match: re.Match[str]) -> str:
        metric = match.group(1) or ""
        body = match.group(2).strip().rstrip(",")
        matchers = [m for m in body.split(",") if m.strip()] if body else []
        labels = set()
        for matcher in matchers:
            parsed = _MATCHER.fullmatch(matcher)
            if not parsed:
                raise PromQLError(f"cannot read the matcher {matcher.strip()!r} in {expr!r}")
            labels.add(parsed.group(1))
        if "__name__" in labels or not metric:
            raise PromQLError(f"name every metric outright, not by a __name__ matcher: {expr!r}")
        found.labels.setdefault(metric, set()).update(labels)
        return f" {metric} "

    text = _SELECTOR.sub(selector, text)
    for match in _IDENT.finditer(text):
        word = match.group(0)
        called = text[match.end():].lstrip().startswith("(")
        if word in KEYWORDS or word in ("inf", "nan", "Inf", "NaN"):
            continue
        if called:
            if word not in FUNCTIONS | AGGREGATIONS:
                raise PromQLError(f"unknown function {word!r} in {expr!r}")
            continue
        if word in AGGREGATIONS:  # `sum by (x) (...)`: the call follows the grouping
            continue
        if text[match.start() - 1:match.start()].isdigit():  # 1e3, 5m-like literals
            continue
        found.metrics.add(word)
        found.labels.setdefault(word, set())
    return found


@dataclass(frozen=True)
class Exported:
    """A metric a process exports: its sample names and label names."""

    family: str
    kind: str
    labels: frozenset[str]

    def samples(self) -> set[str]:
        """The names a query may select: counters are ``_total``, histograms come as
        ``_bucket``/``_count``/``_sum`` (``prometheus_client``'s exposition)."""
        suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                    "histogram": ("_bucket", "_count", "_sum", "_created"),
                    "summary": ("", "_count", "_sum", "_created"), "info": ("_info",),
                    "unknown": ("",)}[self.kind]
        return {self.family + suffix for suffix in suffixes}

    def sample_labels(self, sample: str) -> frozenset[str]:
        if sample == f"{self.family}_bucket":
            return self.labels | {"le"}
        return self.labels


def exported(registry: CollectorRegistry) -> dict[str, Exported]:
    """Every metric of a registry by sample name. Label names come from the metric objects
    (a labelled metric with no children yet has no samples to read them from)."""
    label_names: dict[str, tuple[str, ...]] = {}
    for collector in list(registry._collector_to_names):
        name = getattr(collector, "_name", None)
        if name is not None:
            label_names[name] = tuple(getattr(collector, "_labelnames", ()))
    by_sample: dict[str, Exported] = {}
    for family in registry.collect():
        labels = set(label_names.get(family.name, ()))
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        metric = Exported(family.name, family.type, frozenset(labels))
        for sample in metric.samples():
            by_sample[sample] = metric
    return by_sample


def unknown(expr: str, catalog: dict[str, Exported],
            extra_labels: frozenset[str] = frozenset()) -> list[str]:
    """What ``expr`` names that no registry in ``catalog`` exports (empty when all is
    known). ``extra_labels`` are the labels Prometheus itself adds (job, instance, ...)."""
    parsed = names(expr)
    problems = [f"metric {m}" for m in sorted(parsed.metrics) if m not in catalog]
    for metric, labels in sorted(parsed.labels.items()):
        if metric in catalog:
            allowed = catalog[metric].sample_labels(metric) | extra_labels
            problems += [f"label {metric}{{{label}}}" for label in sorted(labels - allowed)]
    known_labels = set(extra_labels) | {"le"}
    for metric in parsed.metrics & set(catalog):
        known_labels |= catalog[metric].sample_labels(metric)
    problems += [f"grouping label {label}" for label in sorted(parsed.grouping - known_labels)]
    return problems
