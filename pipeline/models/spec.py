"""One model file: ``models/NAME.sql`` or ``models/SCHEMA/NAME.sql`` = a header comment
block + one read-only SELECT.

Why a header comment and not a YAML side file: the file stays valid SQL that any editor,
linter or ``icefloe query`` can run as is, and everything about a model sits in one place::

    -- materialized: merge          view | table | append | merge (default: view)
    -- unique_key: day, url         merge only: the columns an upsert matches on
    -- target: mart.daily_traffic   default: models.<file stem>, or SCHEMA.<file stem>
    -- dialect: duckdb              spark (default), duckdb or postgres: transpiled to Spark
    -- audit: SELECT * FROM this WHERE day IS NULL    (repeatable; see below)

OndatraSQL's directive spelling works too: ``-- @kind: merge`` is ``materialized: merge``,
and every key may carry the ``@`` (``-- @unique_key: day``).

Only leading ``--`` lines are the header. A ``key: value`` line with a key outside the list
above is an error (a typo such as ``materialised`` must not silently fall back to ``view``),
and so is any ``-- @...`` line that is not a known directive (``-- @grain: ...``), in the
header or below it; other comment lines are free text.

A model in a subfolder takes its schema from the folder: ``models/staging/sessions.sql`` is
the model ``staging.sessions`` writing the table ``staging.sessions`` (a ``target`` there
must stay in that schema). Folders nest one level: the schema is one name.

``-- @audit: <query>`` (one line each, any number) is a check the rows a run is about to
commit must pass: the query reads them as the table ``this`` and must return no rows, or the
commit is aborted (see :mod:`pipeline.models.audit`). Audits are parsed in the model's
dialect when the file is read, and may read nothing but ``this`` (and their own CTEs), so a
typo fails before anything runs rather than after Spark computed the result.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from icefloe.errors import IcefloeError
from icefloe.streams.events_sql import is_events_file

if TYPE_CHECKING:
    from sqlglot import exp

MATERIALIZATIONS = ("view", "table", "append", "merge")
INCREMENTAL = ("append", "merge")
DIALECTS = ("spark", "duckdb", "postgres")
DEFAULT_NAMESPACE = "models"
_KEYS = ("materialized", "unique_key", "target", "dialect", "description", "audit")
_REPEATABLE = ("audit",)
THIS = "this"
"""The table name an audit reads the model's fresh rows under."""
_ALIASES = {"kind": "materialized"}  # OndatraSQL's name -> ours
_HEADER_LINE = re.compile(r"^--\s*(@?)([A-Za-z_]+)\s*:\s*(.*?)\s*$")
_DIRECTIVE = re.compile(r"^\s*--\s*@(\S*)")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EQUALS = re.compile(r"^--\s*@?([A-Za-z_]+)\s*=")


class ModelError(IcefloeError):
    """A model cannot be loaded, planned or run; the message names the model."""


@dataclass(frozen=True)
class Audit:
    """One ``-- @audit:`` query: ``line`` of the file, the SQL as written, its tree."""

    line: int
    sql: str
    tree: exp.Query


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
    audits: tuple[Audit, ...] = ()

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

    def select_items(self) -> dict[str, str]:
        """Each named output column of the outermost SELECT → its expression as Spark SQL
        (``*`` items are left out): compared across runs to detect renames."""
        if not isinstance(self.tree, exp.Select):
            return {}
        items: dict[str, str] = {}
        for item in self.tree.expressions:
            if item.is_star or not item.alias_or_name:
                continue
            items[item.alias_or_name] = item.unalias().sql(dialect="spark", comments=False)
        return items

    @property
    def sql_sha256(self) -> str:
        """sha256 of the normalized SQL alone (the query as Spark SQL, comments and
        formatting gone): what the commit metadata records as the model's SQL hash."""
        normalized = self.tree.sql(dialect="spark", comments=False)
        return hashlib.sha256(normalized.encode()).hexdigest()


def load_models(folder: Path) -> list[Model]:
    """Every ``*.sql`` file of ``folder`` and its schema subfolders, sorted by path; two
    models may not share a target. Files headed ``-- @kind: events`` are streams, read with
    the config (:mod:`icefloe.streams.events_sql`), not models: they are skipped here."""
    if not folder.is_dir():
        raise ModelError(f"models folder {folder} does not exist (give --models DIR)")
    models = [parse_model(path, _schema_of(folder, path)) for path in _model_files(folder)
              if not is_events_file(path.read_text(encoding="utf-8"))]
    targets: dict[str, str] = {}
    for model in models:
        other = targets.setdefault(model.target, model.name)
        if other != model.name:
            raise ModelError(f"models {other!r} and {model.name!r} both write {model.target}")
    return models


def _model_files(folder: Path) -> list[Path]:
    """``*.sql`` files at the top and one folder down; hidden folders are skipped."""
    found = []
    for path in sorted(folder.rglob("*.sql")):
        parts = path.relative_to(folder).parts
        if any(part.startswith(".") for part in parts):
            continue
        if len(parts) > 2:
            raise ModelError(f"{'/'.join(parts)}: models nest one folder deep "
                             "(models/SCHEMA/NAME.sql)")
        found.append(path)
    return found


def _schema_of(folder: Path, path: Path) -> str | None:
    """The schema a subfolder gives its models (None at the top of the models folder)."""
    parts = path.relative_to(folder).parts
    if len(parts) == 1:
        return None
    if not _NAME.match(parts[0]):
        raise ModelError(f"{'/'.join(parts)}: a models subfolder is a schema name and must "
                         "be a SQL identifier (letters, digits, _)")
    return parts[0]


def parse_model(path: Path, schema: str | None = None) -> Model:
    """Read one model file; a bad header or SQL is a :class:`ModelError` naming the file.

    ``schema``: the subfolder the file is in, if any (see the module docstring)."""
    label = f"{schema}/{path.name}" if schema else path.name
    if not _NAME.match(path.stem):
        raise ModelError(f"{label}: a model file name must be a SQL identifier "
                         "(letters, digits, _)")
    name = f"{schema}.{path.stem}" if schema else path.stem
    header, body = _split_header(path.read_text(encoding="utf-8"))
    _refuse_body_directives(label, body)
    settings, spelled, audits = _settings(label, header)
    materialized = settings.get("materialized", "view").lower()
    if materialized not in MATERIALIZATIONS:
        raise ModelError(f"{label}: {spelled.get('materialized', 'materialized')} must be one "
                         f"of {', '.join(MATERIALIZATIONS)} (got {materialized!r})")
    dialect = settings.get("dialect", "spark").lower()
    if dialect not in DIALECTS:
        raise ModelError(f"{label}: dialect must be one of {', '.join(DIALECTS)} "
                         f"(got {dialect!r})")
    target = settings.get("target", name if schema else f"{DEFAULT_NAMESPACE}.{name}")
    if len(target.split(".")) != 2 or not all(_NAME.match(p) for p in target.split(".")):
        raise ModelError(f"{label}: target must be namespace.table (got {target!r})")
    if schema and target.split(".")[0] != schema:
        raise ModelError(f"{label}: target {target} is outside schema {schema!r}, which "
                         f"the folder gives; move the file or write {schema}.<table>")
    key = tuple(k.strip() for k in settings.get("unique_key", "").split(",") if k.strip())
    if materialized == "merge" and not key:
        raise ModelError(f"{label}: a merge model needs `-- unique_key: col[, col]`")
    if key and materialized != "merge":
        raise ModelError(f"{label}: unique_key only applies to materialized: merge")
    return Model(name=name, path=path, materialized=materialized, target=target,
                 dialect=dialect, unique_key=key, sql=body,
                 tree=parse_select(body, dialect, label),
                 description=settings.get("description", ""),
                 audits=tuple(_audit(label, line, sql, dialect) for line, sql in audits))


def _audit(label: str, line: int, sql: str, dialect: str) -> Audit:
    """Parse one audit; it may read only ``this`` and its own CTEs."""
    where = f"{label} line {line}: audit"
    tree = parse_select(sql, dialect, where)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if table.db or (name != THIS and name not in ctes):
            raise ModelError(f"{where} reads {table.sql(dialect=dialect)}; an audit reads "
                             f"only the model's new rows, as the table `{THIS}`")
    return Audit(line, sql, tree)


def parse_select(sql: str, dialect: str, label: str) -> exp.Query:
    """Exactly one read-only query in ``dialect``, else a one-line :class:`ModelError`."""
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


def _split_header(text: str) -> tuple[list[tuple[int, str]], str]:
    """Leading ``--`` lines with their line numbers (blank lines allowed between them) and
    the rest."""
    lines = text.splitlines()
    header: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("--"):
            header.append((index + 1, stripped))
        elif stripped:
            return header, "\n".join(lines[index:])
    return header, ""


def _settings(label: str, header: list[tuple[int, str]]
              ) -> tuple[dict[str, str], dict[str, str], list[tuple[int, str]]]:
    """``({key: value}, {key: as the file spelled it}, [(line, audit SQL)])``; unknown keys
    and directives fail."""
    settings: dict[str, str] = {}
    spelled: dict[str, str] = {}
    audits: list[tuple[int, str]] = []
    for number, line in header:
        match = _HEADER_LINE.match(line)
        if match is None:
            directive = _DIRECTIVE.match(line)
            if directive is not None:
                raise ModelError(f"{label}: directive `-- @{directive.group(1)}` is not "
                                 f"understood: write `-- @key: value` ({_known()})")
            equals = _EQUALS.match(line)
            if equals is not None and _is_key(equals.group(1)):
                raise ModelError(f"{label}: header line {line!r} (line {number}) is not "
                                 f"read: write `-- {equals.group(1)}: value`")
            continue  # free-text comment
        at, written = match.group(1), match.group(2).lower()
        key = _ALIASES.get(written, written) if at else written
        if key not in _KEYS:
            what = f"directive `-- @{written}`" if at else f"header key {written!r}"
            raise ModelError(f"{label}: unknown {what} ({_known()})")
        if key in _REPEATABLE:
            audits.append((number, match.group(3)))
            continue
        if key in settings:
            raise ModelError(f"{label}: header key {key!r} given twice "
                             f"(as {spelled[key]!r} and {at + written!r})")
        settings[key] = match.group(3)
        spelled[key] = at + written
    return settings, spelled, audits


def _known() -> str:
    return ("known: " + ", ".join(_KEYS) + "; with @: @kind (= materialized), "
            + ", ".join(f"@{k}" for k in _KEYS if k != "materialized"))


def _is_key(word: str) -> bool:
    lowered = word.lower()
    return lowered in _KEYS or lowered in _ALIASES


def _refuse_body_directives(label: str, body: str) -> None:
    """A ``-- @…`` directive or a ``-- key: value`` header line below the SQL's first
    line would be ignored (the model silently a ``view``): refuse it. The header is the
    leading ``--`` lines: a ``/* … */`` comment before them ends it."""
    for number, line in enumerate(body.splitlines(), start=1):
        directive = _DIRECTIVE.match(line)
        if directive is not None:
            raise ModelError(f"{label}: directive `-- @{directive.group(1).rstrip(':')}` "
                             f"below the SQL (line {number} of the query) is not read; "
                             "directives go in the header, before the SQL")
        match = _HEADER_LINE.match(line.strip())
        if match is not None and _is_key(match.group(2)):
            raise ModelError(f"{label}: header key `-- {match.group(2)}:` below the start of "
                             f"the query (line {number} of it) is not read; the header is the "
                             "file's leading `--` lines (a `/* */` comment or SQL before "
                             "them ends it)")
