"""Fill the generated parts of icefloe's docs: benchmark figures, the command table and the
metric lists.

Why generated: a figure typed by hand is right on the day it is typed; a list kept by hand is
right until the next command or metric. Each part below is written only by this script,
between markers in any Markdown file of the repository (README.md, docs/, bench/README.md):

    <!-- figures:start NAME [TEXT] -->   the results of bench/results/NAME.json (only the rows
    ...                                  whose name holds TEXT, when given), with the date,
    <!-- figures:end -->                 machine, command and commit they were measured at,
                                         and the targets of bench/targets.toml beside them
    <!-- commands:start -->              every `icefloe` command and sub-command, its usage
    ...                                  and help line, read from the argparse parsers
    <!-- commands:end -->
    <!-- metrics:start ROLE -->          the Prometheus metrics of ROLE (ingestor, collector,
    ...                                  admin): name, type, labels, help, read from the
    <!-- metrics:end -->                 classes that register them
    <!-- kafka-apis:start -->            the Kafka APIs and versions the listener serves,
    <!-- kafka-apis:end -->              read from ingestor/kafka/apis.py
    <!-- otlp-columns:start KIND -->     the columns of an OTLP table (logs, spans, gauge,
    <!-- otlp-columns:end -->            ...) but the resource and scope ones (KIND
                                         ``resource``): from icefloe/otlp/schemas.py
    <!-- runs:start NAME -->             every full run of a benchmark kept in
    <!-- runs:end -->                    bench/results/NAME-runs/*.json (the one of record
                                         and those before it): per run, how many of each
                                         row's rounds met their target, and the lowest ratio

tests/system/test_generated_docs.py runs ``--check`` and fails when a marked part is stale,
when a figure table holds a number outside a marker, or when a result file lacks its
provenance.

Usage: python scripts/gen_docs.py           # rewrite every marked part
       python scripts/gen_docs.py --check   # exit 1 naming the stale parts
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TARGETS = ROOT / "bench" / "targets.toml"
MARKER = re.compile(r"(<!-- (?P<kind>figures|commands|metrics|kafka-apis|otlp-columns|runs)"
                    r":start"
                    r"(?P<args>[^>]*?)-->\n)"
                    r"(?P<body>.*?)"
                    r"(<!-- (?P=kind):end -->)", re.S)
SKIP = {".venv", "node_modules", "site", ".git", "build", "dist"}


class DocsError(ValueError):
    """A marker names something that does not exist (a result file, a role)."""


def markdown_files() -> Iterator[Path]:
    """Every Markdown file of the repository that is not a dependency or a build output."""
    for path in sorted(ROOT.rglob("*.md")):
        if not SKIP.intersection(path.relative_to(ROOT).parts):
            yield path


# -- figures ----------------------------------------------------------------------------------


def number(value: float | None) -> str:
    """``1921522.5`` → ``1.92 M``; ``95248.6`` → ``95.2 k``; ``0.7663`` → ``0.766``."""
    if value is None:
        return ""
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.2f} M"
    if size >= 1e4:
        return f"{value / 1e3:.1f} k"
    if size >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def against(shown: str, measured: float | None, bound: float | None) -> str:
    """``shown`` (a figure as the table rounds it), or more of its digits when that rounding
    lands on the target's bound: a ratio of 0.797 read as "0.80 … not met" looks like a
    wrong verdict, so it is written 0.797."""
    if measured is None or bound is None or measured == bound:
        return shown
    if shown not in (ratio(bound), number(bound)):
        return shown
    digits = 3
    while f"{measured:.{digits}f}" == f"{bound:.{digits}f}" and digits < 9:
        digits += 1
    return f"{measured:.{digits}f}"


def load_result(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise DocsError(f"figures marker names {name!r}, but {path.relative_to(ROOT)} does not "
                        f"exist: run `make bench` (or that benchmark with --json {path})")
    return json.loads(path.read_text())


def load_targets() -> dict[str, dict[str, str]]:
    """``bench/targets.toml``: per result file, figure name → ``"ratio >= 0.75"``."""
    return tomllib.loads(TARGETS.read_text()) if TARGETS.is_file() else {}


TARGET = re.compile(r"^(value|ratio)\s*(>=|<=)\s*([0-9.]+)$")


def parse_target(target: str) -> tuple[str, str, float]:
    """``"ratio >= 0.75"`` as ``("ratio", ">=", 0.75)``."""
    found = TARGET.match(target.strip())
    if found is None:
        raise DocsError(f"target {target!r} is not `value|ratio >=|<= NUMBER`")
    return found.group(1), found.group(2), float(found.group(3))


def verdict(row: dict[str, Any], target: str) -> str:
    """``"ratio >= 0.75"`` against the row: ``≥ 0.75 (ratio): met``."""
    field, op, bound = parse_target(target)
    measured = row.get(field)
    if measured is None:
        return f"{op} {number(bound)} ({field}): no {field} measured"
    met = measured >= bound if op == ">=" else measured <= bound
    shown = "≥" if op == ">=" else "≤"
    return f"{shown} {number(bound)} ({field}): {'met' if met else 'not met'}"


def provenance_line(result: dict[str, Any]) -> str:
    hw = result.get("hardware", {})
    commit = str(result.get("commit", "unknown"))
    return (f"Measured {result.get('date', 'at an unknown date')} at commit `{commit[:12]}"
            f"{'+dirty' if commit.endswith('+dirty') else ''}` on {hw.get('cpu') or 'a CPU'}"
            f" ({hw.get('cores')} cores, {hw.get('memory_gib')} GiB, Python "
            f"{hw.get('python')}; 1-minute load {result.get('load_1m', '?')}) by "
            f"`{result.get('command', '?')}`.")


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def figures(args: str) -> str:
    name, _, only = args.strip().partition(" ")
    result = load_result(name)
    targets = load_targets().get(name, {})
    rows = [r for r in result["results"] if only.strip() in r["name"]]
    if not rows:
        raise DocsError(f"no row of bench/results/{name}.json holds {only.strip()!r}")
    lines = [provenance_line(result), "",
             "| figure | value | unit | baseline (same run) | ratio | target |",
             "|---|---:|---|---:|---:|---|"]
    for row in rows:
        target = targets.get(row["name"])
        field, _, bound = parse_target(target) if target else ("", "", None)
        value = number(row["value"])
        shown_ratio = ratio(row.get("ratio"))
        if field == "value":
            value = against(value, row["value"], bound)
        elif field == "ratio":
            shown_ratio = against(shown_ratio, row.get("ratio"), bound)
        lines.append(f"| {cell(row['name'])} | {value} | {cell(row['unit'])} | "
                     f"{number(row.get('baseline'))} | {shown_ratio} | "
                     f"{verdict(row, target) if target else ''} |")
    return "\n".join(lines) + "\n"


ROUND = re.compile(r"^(?P<row>.*), run \d+, round \d+ \(target [^)]*\)$")


def runs(args: str) -> str:
    """Every kept full run of one benchmark: why a table of its runs, not only the run of
    record: a target met in one run says little about the next on a shared 2-core VM, so
    the docs show each run kept, the ones that fell short included."""
    name = args.strip()
    folder = RESULTS / f"{name}-runs"
    kept = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not kept:
        raise DocsError(f"runs marker names {name!r}, but bench/results/{name}-runs holds "
                        "no result file: copy each full run's --json file there")
    targets = load_targets().get(name, {})
    results = [json.loads(path.read_text()) for path in kept]
    results.sort(key=lambda r: str(r.get("date", "")))
    rows: list[str] = []
    for result in results:
        for row in result["results"]:
            found = ROUND.match(row["name"])
            if found and row["name"] in targets and found.group("row") not in rows:
                rows.append(found.group("row"))
    if not rows:
        raise DocsError(f"no run in bench/results/{name}-runs has rounds with targets")
    lines = ["| measured | commit | 1-minute load | " + " | ".join(
                 f"{cell(row)}: rounds met, lowest ratio" for row in rows) + " |",
             "|---|---|---:|" + "---|" * len(rows)]
    for result in results:
        cells = []
        for wanted in rows:
            met = total = 0
            lowest: float | None = None
            for row in result["results"]:
                found = ROUND.match(row["name"])
                target = targets.get(row["name"])
                if not found or found.group("row") != wanted or target is None:
                    continue
                total += 1
                met += verdict(row, target).endswith(": met")
                if row.get("ratio") is not None:
                    lowest = row["ratio"] if lowest is None else min(lowest, row["ratio"])
            cells.append(f"{met} of {total}, {lowest:.3f}" if total and lowest is not None
                         else f"{met} of {total}" if total else "not measured")
        lines.append(f"| {result.get('date', '?')} | `{str(result.get('commit', '?'))[:7]}` "
                     f"| {result.get('load_1m', '?')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- commands ---------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps sub-commands only here
        if isinstance(action, argparse._SubParsersAction):
            seen: dict[int, str] = {}
            for word, sub in action.choices.items():
                seen.setdefault(id(sub), word)
            return {word: sub for word, sub in action.choices.items() if seen[id(sub)] == word}
    return {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def _usage(parser: argparse.ArgumentParser) -> str:
    """One line per usage: argparse wraps at ``COLUMNS``, set wide only while formatting.
    (Setting it for the whole process leaked into the test run that imports this script:
    pytest drew its report 10,000 columns wide and CI's excerpt of a failure was all rules.)"""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "10000"
    try:
        text = " ".join(parser.format_usage().split())
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return text.removeprefix("usage: ")


def commands(args: str) -> str:
    sys.path.insert(0, str(ROOT))
    from icefloe_app.cli import build_parser  # lazy: imports every command module

    lines = ["| command | what it does |", "|---|---|"]

    def walk(parser: argparse.ArgumentParser, aliases: dict[str, list[str]]) -> None:
        helps = _helps(parser)
        for word, sub in _subparsers(parser).items():
            nested = _subparsers(sub)
            if nested:
                walk(sub, aliases)
                continue
            also = f" (alias {', '.join(f'`{a}`' for a in aliases.get(word, []))})" \
                if aliases.get(word) else ""
            lines.append(f"| `{cell(_usage(sub))}`{also} | {cell(helps.get(word, ''))} |")

    from icefloe_app.cli.commands import COMMANDS  # lazy: as above

    walk(build_parser(), {c.name: list(c.aliases) for c in COMMANDS})
    return "\n".join(lines) + "\n"


# -- metrics ----------------------------------------------------------------------------------


def _role_registry(role: str) -> Any:
    sys.path.insert(0, str(ROOT))
    match role:
        case "ingestor":
            from ingestor.metrics import IngestMetrics  # lazy: per role

            return IngestMetrics().registry
        case "collector":
            from collector.metrics import CollectorMetrics  # lazy: per role

            return CollectorMetrics().registry
        case "admin":
            from icefloe_app.api.app import AdminMetrics  # lazy: per role

            return AdminMetrics().registry
    raise DocsError(f"metrics marker names role {role!r}: one of ingestor, collector, admin")


def metrics(args: str) -> str:
    registry = _role_registry(args.strip())
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    rows = []
    # the registered metric objects carry their label names even before a first sample
    for metric in list(registry._collector_to_names):
        for family in metric.describe() if hasattr(metric, "describe") else metric.collect():
            shown = f"{family.name}_total" if family.type == "counter" else family.name
            labels = getattr(metric, "_labelnames", ())
            rows.append(f"| `{shown}` | {family.type} | "
                        f"{', '.join(f'`{x}`' for x in labels)} | "
                        f"{cell(' '.join(family.documentation.split()))} |")
    return "\n".join([*lines, *sorted(rows)]) + "\n"


# -- Kafka APIs -------------------------------------------------------------------------------


def kafka_apis(args: str) -> str:
    """The listener's ApiVersions answer as a table: what a client can negotiate."""
    sys.path.insert(0, str(ROOT))
    from ingestor.kafka import apis  # lazy: only this marker needs it

    lines = ["| API (key) | versions | flexible from | served |", "|---|---|---|---|"]
    for key, (low, high) in sorted(apis.ADVERTISED.items()):
        flexible = apis.FLEXIBLE_FROM.get(key, 99)
        served = "refused with a message (see below)" if key in apis.REFUSING else \
            "yes" if key in apis.SUPPORTED else \
            "listed only (closes the connection; see below)"
        lines.append(f"| {apis.api_name(key)} ({key}) | v{low}-v{high} | "
                     f"{f'v{flexible}' if flexible <= high else '-'} | {served} |")
    return "\n".join(lines) + "\n"


# -- OTLP tables ------------------------------------------------------------------------------


def otlp_columns(args: str) -> str:
    """One OTLP table's own columns, or (``resource``) the resource and scope columns every
    table ends with, as :mod:`icefloe.otlp.schemas` declares them."""
    sys.path.insert(0, str(ROOT))
    from icefloe.otlp.schemas import COLUMNS, RESOURCE_SCOPE  # lazy: only this marker

    kind = args.strip()
    if kind != "resource" and kind not in COLUMNS:
        raise DocsError(f"otlp-columns marker names kind {kind!r}: resource or one of "
                        f"{', '.join(COLUMNS)}")
    columns = RESOURCE_SCOPE if kind == "resource" else \
        [c for c in COLUMNS[kind] if c not in RESOURCE_SCOPE]
    lines = ["| column | type | meaning |", "|---|---|---|"]
    for column in columns:
        lines.append(f"| `{column.name}` | `{column.type}` | {cell(column.doc)} |")
    return "\n".join(lines) + "\n"


# -- filling ----------------------------------------------------------------------------------


RENDER: dict[str, Callable[[str], str]] = {"figures": figures, "commands": commands,
                                           "metrics": metrics, "kafka-apis": kafka_apis,
                                           "otlp-columns": otlp_columns, "runs": runs}


def filled(text: str) -> str:
    """``text`` with every marked part rendered again."""
    return MARKER.sub(lambda m: m.group(1) + RENDER[m.group("kind")](m.group("args"))
                      + m.group(5), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming every stale file")
    args = parser.parse_args(argv)
    stale = []
    try:
        for path in markdown_files():
            text = path.read_text()
            if not MARKER.search(text):
                continue
            new = filled(text)
            if new != text:
                stale.append(path.relative_to(ROOT))
                if not args.check:
                    path.write_text(new)
    except DocsError as exc:
        print(f"gen_docs: {exc}", file=sys.stderr)
        return 2
    for path in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {path}")
    if args.check and stale:
        print("run `.venv/bin/python scripts/gen_docs.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
