"""A sink's ``where`` is refused when the config loads if it does not parse, reads an
unknown column, calls a function outside the allow-list, or is not a per-event boolean;
both output paths accept a good one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from config_support import HEADER, load_text

from icefloe.errors import ConfigError

BASE = HEADER + textwrap.dedent("""
    {collector}
    [[streams]]
    name = "shop"
    table = "shop.purchases"
    columns = [
      {{ name = "event_name", type = "string" }},
      {{ name = "amount", type = "double" }},
    ]
    where = {where}
""")


def load(tmp_path: Path, where: str, collector: str = "") -> object:
    return load_text(tmp_path, BASE.format(where=where, collector=collector))


def test_should_load_a_where_and_its_unrouted_default(tmp_path: Path) -> None:
    config = load(tmp_path, '"event_name = \'purchase\' AND amount > 100"')
    stream = config.stream("shop")  # type: ignore[attr-defined]
    assert stream.where == "event_name = 'purchase' AND amount > 100"
    assert stream.unrouted == "drop"


@pytest.mark.parametrize(("where", "problem"), [
    ('"event_name = "', "does not parse"),
    ('"colour = \'red\'"', "unknown column 'colour'"),
    ('"reflect(\'java.lang.System\', \'exit\', 1) = 1"', "function reflect is not allowed"),
    ('"sum(amount) > 1"', "aggregate"),
    ('"amount + 1"', "not a boolean"),
    ('"amount IN (SELECT 1)"', "subquery"),
    ('"event_name = 1"', "different types"),
])
def test_should_refuse_a_bad_where_naming_the_sink(tmp_path: Path, where: str,
                                                  problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, where)
    text = str(info.value)
    assert "streams[0].where" in text
    assert "sink 'shop'" in text
    assert problem in text


def test_should_accept_a_where_with_the_cluster_output_path(tmp_path: Path) -> None:
    """Both output paths route by content (#28): the executors evaluate the predicate."""
    config = load(tmp_path, '"amount > 1"', '[collector]\noutput = "cluster"')
    assert config.stream("shop").where == "amount > 1"  # type: ignore[attr-defined]
    assert config.collector.output == "cluster"  # type: ignore[attr-defined]
