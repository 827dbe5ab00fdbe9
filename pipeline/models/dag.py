"""Resolve what each model reads, order the models, and refuse bad projects before a run.

Why all of this happens before Spark starts: a cycle, a typo in a table name or a model
writing over a stream's raw table should cost a one-line error, not a half-run DAG.

A table reference in a model resolves, in this order, to

1. another model, by file stem (``staging_sessions``) or by target (``staging.sessions``);
2. an icefloe table, by the rules of ``icefloe query`` (:func:`pipeline.read.query.resolve_name`).

CTE names are not references. The order is topological, ties broken by name, so a run is
reproducible; a cycle is reported as the path that closes it (``a → b → a``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from icefloe.config import Config
from icefloe.errors import CatalogError
from pipeline.models.audit import audit_sql
from pipeline.models.spec import Model, ModelError
from pipeline.read.query import (
    DEAD_LETTERS,
    QueryError,
    catalog_versions,
    check_clauses,
    cte_names,
    is_cte,
    pin,
    refuse_lost_meaning,
    resolve_name,
    spark_sql,
    time_travel,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from sqlglot import exp

@dataclass(frozen=True)
class Ref:
    """What one table reference reads: ``kind`` is ``table`` or ``model``.

    ``name`` is the table identifier (``table``) or the model name (``model``).
    """

    kind: str
    name: str


@dataclass(frozen=True)
class Project:
    """The models in run order and, per model, the distinct references it makes."""

    models: dict[str, Model]  # insertion order = topological order
    refs: dict[str, tuple[Ref, ...]]

    def upstream(self, name: str) -> list[str]:
        """Models ``name`` reads directly."""
        return [r.name for r in self.refs[name] if r.kind == "model"]

    def select(self, names: Sequence[str]) -> list[Model]:
        """The named models in run order (all when ``names`` is empty)."""
        unknown = [n for n in names if n not in self.models]
        if unknown:
            raise ModelError(f"no model named {', '.join(map(repr, unknown))} (models: "
                             f"{', '.join(self.models) or 'none'})")
        return [m for n, m in self.models.items() if not names or n in names]


def references(tree: exp.Expr) -> list[exp.Table]:
    """Table nodes that name a table (CTE names, matched as SQL matches them, ignoring
    case, and table functions excluded)."""
    ctes = cte_names(tree)
    return [t for t in tree.find_all(exp.Table) if t.name and not is_cte(t, ctes)]


def travels(node: exp.Table) -> bool:
    """Whether the reference has a time-travel clause (``AT (...)`` or ``FOR ... AS OF``)."""
    return node.args.get("version") is not None or node.args.get("when") is not None


def check_model_sql(model: Model) -> None:
    """Refuse, before anything runs, a clause or construct the rewrite cannot honour
    (see :func:`pipeline.read.query.check_clauses`), a malformed time-travel clause, and in
    the model or one of its audits a construct Spark would answer by other rules than the
    model's dialect."""
    tree = model.tree.copy()
    try:
        ctes = cte_names(tree, model.dialect)
        refuse_lost_meaning(tree, model.dialect)
        for node in tree.find_all(exp.Table):
            if node.name:
                check_clauses(node, ctes)
                time_travel(node)
        spark_sql(tree, model.dialect)
    except QueryError as exc:
        raise ModelError(f"model {model.name}: {exc}") from None
    for audit in model.audits:
        try:
            audit_sql(audit, "__icefloe_this", model.dialect)
        except ModelError as exc:
            raise ModelError(f"model {model.name}: {exc}") from None


class Resolver:
    """Turns one model's ``exp.Table`` nodes into :class:`Ref`\\ s."""

    def __init__(self, models: Iterable[Model], config: Config) -> None:
        self.by_name = {m.name: m for m in models}
        self.by_target = {m.target: m for m in self.by_name.values()}
        self.config = config

    def resolve(self, model: Model, node: exp.Table) -> Ref:
        if node.catalog:
            raise ModelError(f"model {model.name}: {node.sql()}: use namespace.table, "
                             "without a catalog name")
        qualified = f"{node.db}.{node.name}" if node.db else node.name
        other = self.by_name.get(qualified) or self.by_target.get(qualified)
        if other is not None:
            if other.name == model.name:
                raise ModelError(f"model {model.name} reads itself ({qualified}); a model "
                                 "cannot depend on its own result")
            if travels(node) and not other.stored:
                raise ModelError(f"model {model.name}: {other.name} is a view; only stored "
                                 "tables have versions to travel to")
            return Ref("model", other.name)
        try:
            return Ref("table", resolve_name(node, self.config))
        except QueryError as exc:
            raise ModelError(f"model {model.name}: {exc}") from None


def plan_project(models: Sequence[Model], config: Config) -> Project:
    """Resolve every reference and order the models; errors name the model or cycle."""
    raw = {s.table for s in config.streams} | {DEAD_LETTERS}
    for model in models:
        if model.target in raw:
            raise ModelError(f"model {model.name}: target {model.target} is an icefloe "
                             "stream table; a model must write its own table")
    resolver = Resolver(models, config)
    refs: dict[str, tuple[Ref, ...]] = {}
    for model in models:
        check_model_sql(model)
        found = [resolver.resolve(model, node) for node in references(model.tree)]
        refs[model.name] = tuple(dict.fromkeys(found))
    order = topological_order({m: [r.name for r in rs if r.kind == "model"]
                               for m, rs in refs.items()})
    by_name = {m.name: m for m in models}
    return Project({n: by_name[n] for n in order}, {n: refs[n] for n in order})


def topological_order(upstream: dict[str, list[str]]) -> list[str]:
    """Every name after the names it depends on; a cycle raises naming its path."""
    order: list[str] = []
    state: dict[str, str] = {}  # "visiting" | "done"

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = [*path[path.index(name):], name]
            raise ModelError(f"models form a cycle: {' → '.join(cycle)}")
        state[name] = "visiting"
        for dependency in sorted(upstream[name]):
            visit(dependency, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in sorted(upstream):
        visit(name, [])
    return order


def check_tables(project: Project, config: Config) -> None:
    """Every icefloe table a model reads exists in the catalog (model targets may not yet),
    and every version or time a reference travels to exists in its table."""
    from pipeline.read.iceberg_source import load_table  # lazy: pyspark

    loaded: dict[str, Table] = {}
    for name, refs in project.refs.items():
        for ref in refs:
            if ref.kind != "table" or ref.name in loaded:
                continue
            try:
                loaded[ref.name] = load_table(config.catalog, ref.name)
            except CatalogError as exc:
                raise ModelError(f"model {name}: {exc}") from None
    resolver = Resolver(project.models.values(), config)
    for model in project.models.values():
        for node in references(model.tree.copy()):
            ref = resolver.resolve(model, node)
            clause = time_travel(node)
            if clause is None or ref.name not in loaded:
                continue  # a stored model's table is checked when the run reads it
            try:
                pin(loaded[ref.name], ref.name, clause,
                    catalog_versions(config, loaded.values(), [clause]))
            except (QueryError, CatalogError) as exc:
                raise ModelError(f"model {model.name}: {exc}") from None
