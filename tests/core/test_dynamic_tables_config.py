"""Table templates (#42) are checked when the config loads: the namespace literal and
free of values, each ``{…}`` part a column or an expression of the ``where`` subset giving
a string or a number, literal parts in ``[a-z0-9_]``, limits in range, the namespace the
template's own; each refusal names the key and the problem. The admin API takes a
template with the same checks (tests/app/test_admin_dynamic.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import msgspec
import pytest
from config_support import HEADER, load_text

from icefloe.errors import ConfigError, RegistryError
from icefloe.streams.dynamic_tables import is_template, split_template

BASE = HEADER + textwrap.dedent("""
    [[streams]]
    name = "events"
    table = {table}
    columns = [
      {{ name = "tenant", type = "string" }},
      {{ name = "n", type = "long" }},
      {{ name = "ok", type = "boolean" }},
      {{ name = "ts", type = "timestamp" }},
    ]
    {extra}
""")


def load(tmp_path: Path, table: str, extra: str = "") -> object:
    return load_text(tmp_path, BASE.format(table=table, extra=extra))


def test_should_load_a_template_and_its_limits(tmp_path: Path) -> None:
    config = load(tmp_path, '"tenants.events_{lower(tenant)}_{n}"',
                  "dynamic_tables = { max_tables = 50, max_name_length = 64 }")
    stream = config.stream("events")  # type: ignore[attr-defined]
    assert stream.table == "tenants.events_{lower(tenant)}_{n}"
    assert stream.dynamic_tables.max_tables == 50
    template = split_template(stream.table)
    assert template.namespace == "tenants"
    assert template.expressions == ("lower(tenant)", "n")
    assert template.pattern().fullmatch("events_acme_42")
    assert is_template(stream.table)


@pytest.mark.parametrize(("table", "key", "problem"), [
    ('"{tenant}.events"', "table", "literal namespace"),
    ('"ten{tenant}.events"', "table", "literal namespace"),
    ('"icefloe.t_{tenant}"', "table", "icefloe's own"),
    ('"tenants.events"', "dynamic_tables", "not a template"),
    ('"tenants.events_{}"', "table", "empty {} part"),
    ('"tenants.events_{tenant"', "table", "unbalanced"),
    ('"tenants.events_{{tenant}}"', "table", "unbalanced or nested"),
    ('"tenants.Events_{tenant}"', "table", "literal part 'Events_'"),
    ('"tenants.a.b_{tenant}"', "table", "a '.' after the namespace"),
    ('"tenants.e_{colour}"', "table", "unknown column 'colour'"),
    ('"tenants.e_{ok}"', "table", "gives a boolean"),
    ('"tenants.e_{ts}"', "table", "gives a temporal"),
    ('"tenants.e_{reflect(\'java.lang.System\', \'exit\')}"', "table", "not allowed"),
    ('"tenants.e_{concat(tenant, \'x\')}"', "table", "not supported in a where"),
    ('"tenants.e_{count(n)}"', "table", "aggregates"),
    ('"tenants.e_{tenant}_{tenant}_{tenant}_{tenant}_{tenant}_{tenant}_{tenant}_{tenant}'
     '_{tenant}"', "table", "at most 8"),
])
def test_should_refuse_a_bad_template_naming_the_key(tmp_path: Path, table: str, key: str,
                                                     problem: str) -> None:
    extra = "dynamic_tables = { max_tables = 5 }" if key == "dynamic_tables" else ""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, table, extra)
    assert f"streams[0].{key}" in str(caught.value)
    assert problem in str(caught.value)


@pytest.mark.parametrize(("limits", "problem"), [
    ("{ max_tables = 0 }", "max_tables: 0 is not 1-1000000"),
    ("{ max_name_length = 300 }", "max_name_length: 300 is not 1-255"),
    ("{ max_name_length = 7 }", "leaves no room"),
])
def test_should_refuse_limits_out_of_range(tmp_path: Path, limits: str, problem: str
                                           ) -> None:
    with pytest.raises(ConfigError, match=r"streams\[0\]\.dynamic_tables") as caught:
        load(tmp_path, '"tenants.events_{tenant}"', f"dynamic_tables = {limits}")
    assert problem in str(caught.value)


@pytest.mark.parametrize(("extra", "key"), [
    ('primary_key = ["n"]', "primary_key"),
    ('unknown_fields = "evolve"', "unknown_fields"),
])
def test_should_refuse_what_templates_do_not_support_yet(tmp_path: Path, extra: str,
                                                         key: str) -> None:
    with pytest.raises(ConfigError, match=rf"streams\[0\]\.{key}: a table template"):
        load(tmp_path, '"tenants.events_{tenant}"', extra)


def test_should_refuse_another_stream_in_a_templates_namespace(tmp_path: Path) -> None:
    text = BASE.format(table='"tenants.events_{tenant}"', extra="") + textwrap.dedent("""
        [[streams]]
        name = "other"
        table = "tenants.audit"
        columns = [{ name = "x", type = "string" }]
    """)
    with pytest.raises(ConfigError, match=r"streams\[1\]\.table: namespace 'tenants' "
                       r"belongs to the table template"):
        load_text(tmp_path, text)


def test_should_take_a_template_through_the_admin_api_with_the_configs_checks() -> None:
    from icefloe.config import Column  # why: keeps the parametrized loads above light
    from icefloe.registry import ops
    from icefloe.registry.model import Registry
    from icefloe.streams.model import DynamicTables

    spec = ops.SinkSpec(name="per_tenant", table="tenants.events_{tenant}",
                        columns=(Column("tenant", "string"),),
                        dynamic_tables=DynamicTables(max_tables=3))
    made = ops.create_source(Registry(), ops.SourceSpec(id="events", sinks=(spec,)))
    assert made.sources[0].sinks[0].stream("events").dynamic_tables == DynamicTables(3)
    bad = msgspec.structs.replace(spec, table="tenants.e_{colour}")
    with pytest.raises(RegistryError) as caught:
        ops.create_source(Registry(), ops.SourceSpec(id="events", sinks=(bad,)))
    assert caught.value.status == 400
    assert caught.value.details[0]["field"] == "sinks[0].table"
    assert "unknown column 'colour'" in caught.value.details[0]["reason"]


def test_should_load_the_example_of_the_docs(tmp_path: Path) -> None:
    import re  # why: only this test reads the page

    page = (Path(__file__).resolve().parents[2] / "docs" / "streams.md").read_text()
    section = page[page.index("### Tables named by the data"):]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    config = load_text(tmp_path, HEADER + block.group(1))
    stream = config.stream("events")  # type: ignore[attr-defined]
    assert split_template(stream.table).expressions == ("tenant_id",)


async def test_should_seed_a_registry_with_a_template_and_its_limits(tmp_path: Path) -> None:
    """``icefloe admin`` seeds its registry from the config: a template stream's sink keeps
    its template and its limits (the collector routing by the registry reads them)."""
    from icefloe.registry import RegistryStore  # why: keeps the loads above light
    from icefloe.store import open_async_store
    from icefloe.streams.model import DynamicTables

    config = load(tmp_path, '"tenants.events_{tenant}"', "dynamic_tables = { max_tables = 7 }")
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        registry = await RegistryStore(store, "registry/registry.json").seed(
            config.streams, "icefloe.toml")  # type: ignore[attr-defined]
    finally:
        await store.close()
    sink = registry.sources[0].sinks[0]
    assert (sink.table, sink.dynamic_tables) == ("tenants.events_{tenant}",
                                                 DynamicTables(max_tables=7))


@pytest.mark.parametrize("workers", [0, 65])
def test_should_refuse_commit_workers_out_of_range(tmp_path: Path, workers: int) -> None:
    text = HEADER + f"[collector]\ncommit_workers = {workers}\n"
    with pytest.raises(ConfigError, match=rf"collector\.commit_workers: {workers} is not 1-64"):
        load_text(tmp_path, text)
