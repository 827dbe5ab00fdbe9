"""One model file: ``models/NAME.sql`` = a header comment block + one read-only SELECT.

Why a header comment and not a YAML side file: the file stays valid SQL that any editor,
linter or ``icefloe query`` can run as is, and everything about a model sits in one place::

    -- materialized: merge          view | table | append | merge (default: view)
    -- unique_key: day, url         merge only: the columns an upsert matches on
    -- target: mart.daily_traffic   default: models.<file stem>
    -- dialect: duckdb              spark (default), duckdb or postgres: transpiled to Spark

Only leading ``--`` lines are the header. A ``key: value`` line with a key outside the list
above is an error (a typo such as ``materialised`` must not silently fall back to ``view``);
other comment lines are free text.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from icefloe.errors import IcefloeError

if TYPE_CHECKING:
    from sqlglot import exp

MATERIALIZATIONS = ("view", "table", "append", "merge")
INCREMENTAL = ("append", "merge")
DIALECTS = ("spark", "duckdb", "postgres")
DEFAULT_NAMESPACE = "models"
_KEYS = ("materialized", "unique_key", "target", "dialect", "description")
_HEADER_LINE = re.compile(r"^--\s*([A-Za-z_]+)\s*:\s*(.*?)\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelError(IcefloeError):
    """A model cannot be loaded, planned or run; the message names the model."""


@dataclass(frozen=True)
class Model:
    """A parsed model file. Immutable: the runner copies ``tree`` before rewriting it."""

    name: str
    path: Path
    materialized: str
    target: str
    dialect: str
    unique_key: tuple[str, ...]
    sql: str  # the body as written (header removed)
    tree: exp.Query  # parsed in ``dialect``
    description: str = ""

    @property
    def incremental(self) -> bool:
        return self.materialized in INCREMENTAL

    @property
    def stored(self) -> bool:
        """Whether runs write an Iceberg table (a ``view`` stores nothing)."""
        return self.materialized != "view"

    @property
    def sql_hash(self) -> str:
        """Hash of what decides the result: SQL, dialect, materialization and key."""
        text = "\n".join([self.dialect, self.materialized, ",".join(self.unique_key),
                          self.tree.sql(dialect="spark")])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_models(folder: Path) -> list[Model]:
    """Every ``*.sql`` file of ``folder``, sorted by name; two models may not share a target."""
    if not folder.is_dir():
        raise ModelError(f"models folder {folder} does not exist (give --models DIR)")
    models = [parse_model(path) for path in sorted(folder.glob("*.sql"))]
    targets: dict[str, str] = {}
    for model in models:
        other = targets.setdefault(model.target, model.name)
        if other != model.name:
            raise ModelError(f"models {other!r} and {model.name!r} both write {model.target}")
    return models


def parse_model(path: Path) -> Model:
    """Read one model file; a bad header or SQL is a :class:`ModelError` naming the file."""
    name = path.stem
    if not _NAME.match(name):
        raise ModelError(f"{path.name}: a model file name must be a SQL identifier "
                         "(letters, digits, _)")
    header, body = _split_header(path.read_text(encoding="utf-8"))
    settings = _settings(path, header)
    materialized = settings.get("materialized", "view").lower()
    if materialized not in MATERIALIZATIONS:
        raise ModelError(f"{path.name}: materialized must be one of "
                         f"{', '.join(MATERIALIZATIONS)} (got {materialized!r})")
    dialect = settings.get("dialect", "spark").lower()
    if dialect not in DIALECTS:
        raise ModelError(f"{path.name}: dialect must be one of {', '.join(DIALECTS)} "
                         f"(got {dialect!r})")
    target = settings.get("target", f"{DEFAULT_NAMESPACE}.{name}")
    if len(target.split(".")) != 2 or not all(_NAME.match(p) for p in target.split(".")):
        raise ModelError(f"{path.name}: target must be namespace.table (got {target!r})")
    key = tuple(k.strip() for k in settings.get("unique_key", "").split(",") if k.strip())
    if materialized == "merge" and not key:
        raise ModelError(f"{path.name}: a merge model needs `-- unique_key: col[, col]`")
    if key and materialized != "merge":
        raise ModelError(f"{path.name}: unique_key only applies to materialized: merge")
    return Model(name=name, path=path, materialized=materialized, target=target,
                 dialect=dialect, unique_key=key, sql=body,
                 tree=parse_select(body, dialect, path.name),
                 description=settings.get("description", ""))


def parse_select(sql: str, dialect: str, label: str) -> exp.Query:
    """Exactly one read-only query in ``dialect``, else a one-line :class:`ModelError`."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError

    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" (line {first.get('line')}, column {first.get('col')})" if first else ""
        reason = str(first.get("description") or exc).splitlines()[0]
        raise ModelError(f"{label}: SQL does not parse as {dialect}{where}: {reason}") from None
    if len(statements) != 1:
        raise ModelError(f"{label}: a model is exactly one SELECT (got {len(statements)} "
                         "statements)")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise ModelError(f"{label}: a model is a read-only query (SELECT, WITH, UNION ...), "
                         f"not a {tree.key.upper()} statement")
    return tree


def _split_header(text: str) -> tuple[list[str], str]:
    """Leading ``--`` lines (blank lines allowed between them) and the rest."""
    lines = text.splitlines()
    header: list[str] = []
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("--"):
            header.append(stripped)
        elif stripped:
            return header, "\n".join(lines[index:])
    return header, ""


def _settings(path: Path, header: list[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in header:
        match = _HEADER_LINE.match(line)
        if match is None:
            continue  # free-text comment
        key = match.group(1).lower()
        if key not in _KEYS:
            raise ModelError(f"{path.name}: unknown header key {key!r} (known: "
                             f"{', '.join(_KEYS)})")
        if key in settings:
            raise ModelError(f"{path.name}: header key {key!r} given twice")
        settings[key] = match.group(2)
    return settings
