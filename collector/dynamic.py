"""A run's rows of a table template, split into the tables their values name.

Why here, after routing and before the per-table commits: once split, each concrete
table is a table like any other — its own target (the sink with the table filled in),
dedup window, journal, bulkhead, staging and exactly-once commit recording the run's
sequence (:mod:`collector.commit`). A crash between two tables' commits replays the run;
each table drops what it already holds, as for a run writing many static tables. The split
is a pure function of the rows (:mod:`pipeline.table_names`) and of which tables exist,
so a replay names the same tables and refuses the same rows.

``max_tables``: the template's namespace holds its tables only (refused at config load
otherwise), so the tables a sink has are those its namespace lists (once per collector,
then kept up to date as tables are made). New tables of a run are admitted in the order
their first row comes (manifest order), while room is left; the rows of the others go to
the dead letters (``dynamic_table:max_tables``), as do rows whose value is null or empty,
names past ``max_name_length`` and expressions that raise (:data:`RULES`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog

from collector.routing import Routes, Target
from collector.where import reasoned_dead_letters
from icefloe.errors import NamespaceNotFoundError
from icefloe.streams.dynamic_tables import DEFAULT_LIMITS, is_template, reason, split_template
from icefloe.streams.model import DynamicTables as Limits
from icefloe.streams.model import StreamConfig
from pipeline.iceberg import iceberg_errors
from pipeline.load import Named, table_names

log = logging.getLogger("icefloe.collector")

Routed = dict[str, tuple[Target, pa.Table]]
Refused = tuple[pa.Table, pa.Array, pa.Array]
"""Rows a template could not name a table for, with each one's rule and message."""


class DynamicTables:
    """The tables of every template sink: which exist (per namespace), and the split."""

    def __init__(self, catalog: Callable[[], Catalog],
                 limits: Mapping[str, Limits] | None = None) -> None:
        """``limits``: each template's (``dynamic_tables`` of its stream in the config),
        for a sink that does not carry its own (a registry sink made through the admin
        API does: :meth:`limits_of`); the defaults for any other."""
        self.catalog = catalog
        self.limits = dict(limits or {})
        self.existing: dict[str, set[str]] = {}
        """Per template namespace: the tables it holds (full names), listed once."""

    def tables_in(self, namespace: str) -> set[str]:
        """The tables of ``namespace`` (listed at first use, then kept as made)."""
        known = self.existing.get(namespace)
        if known is None:
            try:
                with iceberg_errors(NamespaceNotFoundError):
                    listed = self.catalog().list_tables(namespace)
            except NamespaceNotFoundError:
                listed = []
            known = self.existing[namespace] = {".".join(i) for i in listed}
        return known

    def expand(self, routed: Routed, locations: Mapping[int, str],
               dead: list[pa.Table]) -> Routed:
        """``routed`` with each template's rows split into its tables; refused rows join
        ``dead``. Static tables pass through unchanged."""
        out: Routed = {}
        for table, (target, rows) in routed.items():
            if not is_template(table):
                out[table] = (target, rows)
                continue
            for name, part in self.split(target, rows, locations, dead):
                out[name] = (concrete(target, name), part)
        return out

    def split(self, target: Target, rows: pa.Table, locations: Mapping[int, str],
              dead: list[pa.Table]) -> list[tuple[str, pa.Table]]:
        """One template's rows per table, in order of first row; refused rows to ``dead``."""
        sink = target.sink
        named = table_names(sink.table, sink.columns, self.limits_of(target), rows)
        parts, refused = self.admit(target, rows, named)
        for part, rules, messages in refused:
            dead += refused_rows(target, part, rules, messages, locations)
        return parts

    def limits_of(self, target: Target) -> Limits:
        """The template's limits: its sink's own, else the config's, else the defaults."""
        own = target.sink.dynamic_tables
        return own if own is not None else self.limits.get(target.sink.table, DEFAULT_LIMITS)

    def admit(self, target: Target, rows: pa.Table, named: Named
              ) -> tuple[list[tuple[str, pa.Table]], list[Refused]]:
        """``rows`` (in run order) per table ``named`` gives them, in order of each table's
        first event in the manifest, the tables past ``max_tables`` left out; and the
        refused rows with their rules and messages (those a rule refused, in run order,
        then those over the limit). Both
        output paths decide here: the embedded one on its rows, the cluster one on the
        keys (:mod:`collector.cluster_dynamic`)."""
        sink, limits = target.sink, self.limits_of(target)
        refused_rules: list[Refused] = []
        is_refused = pc.is_valid(named.rules)
        if pc.any(is_refused).as_py():
            refused_rules.append((rows.filter(is_refused), named.rules.filter(is_refused),
                                  named.messages.filter(is_refused)))
            rows, names = rows.filter(pc.invert(is_refused)), named.tables.filter(
                pc.invert(is_refused))
        else:
            names = named.tables
        if rows.num_rows == 0:
            return [], refused_rules
        namespace = split_template(sink.table).namespace
        existing = self.tables_in(namespace)
        room = limits.max_tables - len(existing)
        encoded = pc.dictionary_encode(names)
        order = pc.sort_indices(encoded.indices)  # stable: run order within each table
        counts = pc.value_counts(encoded.indices)
        sizes = dict(zip(counts.field("values").to_pylist(),
                         counts.field("counts").to_pylist(), strict=True))
        taken = rows.take(order)
        parts, start = [], 0
        for index, name in enumerate(encoded.dictionary.to_pylist()):
            size = sizes[index]
            parts.append((name, taken.slice(start, size)))
            start += size
        out, over = [], []
        for name, part in _by_first_sequence(parts):
            if name in existing or room > 0:
                room -= name not in existing
                existing.add(name)  # counted from its admission: made before its rows
                out.append((name, part))
            else:
                over.append(part)
        if over:
            left = pa.concat_tables(over)
            message = (f"table template {sink.table!r} of sink {sink.name!r} has "
                       f"max_tables ({limits.max_tables}) tables already; this event "
                       "would make one more")
            refused_rules.append((left, pa.array(["max_tables"] * left.num_rows),
                                  pa.array([message] * left.num_rows)))
        return out, refused_rules


def _by_first_sequence(parts: list[tuple[str, pa.Table]]) -> list[tuple[str, pa.Table]]:
    """``parts`` (a table name and its rows each) in the order of each one's first event in
    the manifest (its smallest ``_sequence``), ties kept in order. Why: the rows come in
    the engine's partition order, which is not the manifest's; admitted by first row,
    ``max_tables`` would let in other tables than the cluster path, which orders the keys
    by sequence, and other tables on a rerun of the same entries."""
    if not parts or "_sequence" not in parts[0][1].column_names:
        return parts
    firsts = [pc.min(part.column("_sequence")).as_py() for _, part in parts]
    order = sorted(range(len(parts)), key=lambda i: (firsts[i] is None, firsts[i] or 0, i))
    return [parts[i] for i in order]


def concrete(target: Target, table: str) -> Target:
    """``target`` writing ``table``: a sink like any other from here on."""
    return Target(target.source, msgspec.structs.replace(target.sink, table=table))


def refused_rows(target: Target, rows: pa.Table, rules: pa.Array, messages: pa.Array,
                 locations: Mapping[int, str]) -> list[pa.Table]:
    """Dead letters for rows a template could not name a table for, one reason per rule
    (``dynamic_table:<rule>``), ``raw`` as for unrouted events (a redrive sends them
    again)."""
    out = []
    plain = rows.drop_columns([n for n in rows.column_names if n == "_source"])
    for rule in sorted(set(rules.to_pylist())):
        mask = pc.equal(rules, rule)
        out.append(reasoned_dead_letters(target.source.id, plain.filter(mask), dict(locations),
                                 reason(rule), messages.filter(mask)))
        log.info("%d events of source %s refused by table template %s: %s",
                 int(pc.sum(mask).as_py() or 0), target.source.id, target.sink.table, rule)
    return out


def template_target(routes: Routes, table: str) -> Target | None:
    """The template sink whose tables ``table`` is one of (the live one, if any)."""
    namespace, _, name = table.partition(".")
    found = None
    for targets in routes.targets.values():
        for target in targets:
            if not is_template(target.table):
                continue
            template = split_template(target.table)
            if (template.namespace == namespace and template.pattern().fullmatch(name)
                    and (found is None or (target.sink.live and target.source.live))):
                found = target
    return found


def carry_dynamic(old: Routes, new: Routes) -> dict[str, StreamConfig]:
    """The template tables ``old`` had met, with their streams under ``new`` (a sink's
    changed columns or layout then evolve them like a configured table's); a table whose
    template is gone keeps its last stream, so its staged rows can still import."""
    out: dict[str, StreamConfig] = {}
    for name, stream in old.dynamic.items():
        target = template_target(new, name)
        out[name] = stream if target is None else concrete(target, name).stream
    return out


def has_templates(routes: Routes) -> bool:
    return any(is_template(t.table) for ts in routes.targets.values() for t in ts)


def staged_tables(routes: Routes, staged: Iterable[str]) -> dict[str, StreamConfig]:
    """Of the tables with staged rows (a parked table's, kept across a restart), those a
    template names, with their streams: prepared at start like configured tables."""
    out: dict[str, StreamConfig] = {}
    known = routes.tables()
    for name in staged:
        target = None if name in known else template_target(routes, name)
        if target is not None:
            out[name] = concrete(target, name).stream
    return out
