"""Python model classes as streams (#39 item 4, :mod:`icefloe.pymodels`): every annotation's
column type, the refusals (each naming the field and the type), the TOML that
``load_config`` reads back, the encoding of values, the evolution rules; then end to end with
real servers: a dataclass and a pydantic model registered through the real admin API, their
instances sent by the typed client over HTTP and gRPC to a real ingestor, committed by the
collector (its embedded engine, no Spark) and read back from the Iceberg table, before and
after the class gains a field; a changed type refused by the server, naming the field."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import enum
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import msgspec
import pydantic
import pytest

import icefloe
from icefloe.client import IngestRejected
from icefloe.config import Column, Config, load_config
from icefloe.errors import ConfigError, ModelError, RegistryError
from icefloe.pymodels.register import evolve_columns
from icefloe.tokens import hash_token
from tests.admin_support import admin_server
from tests.collector_support import collect_all, collector_config, read_table
from tests.ingest_support import grpc_serving, http_serving
from tests.process_support import free_port

ADMIN_TOKEN = "ifl_typed-models-admin-token"
UTC = dt.UTC
Money = Annotated[Decimal, icefloe.Precision(12, 2)]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Line:
    sku: str
    price: Annotated[Decimal, icefloe.Precision(9, 2)]
    qty: int | None = None


@dataclass
class Everything:
    """Every annotation the mapping knows."""

    id: icefloe.Key[str]
    """The id; the table keeps the latest row per id."""
    n: int
    x: float
    ok: bool
    at: dt.datetime
    day: dt.date
    clock: dt.time
    ref: uuid.UUID
    blob: bytes
    amount: Money
    colour: Colour
    level: Level
    kind: Literal["a", "b"]
    lines: list[Line]
    counts: dict[str, int]
    meta: dict[str, Any]
    anything: Any
    nested_lists: list[list[str]]
    maybe: Optional[str]  # noqa: UP045 (the spelling users write, tested on purpose)
    note: str | None = field(default=None, metadata={"doc": "free text"})


EVERYTHING_COLUMNS = [
    ("id", "string", True), ("n", "long", True), ("x", "double", True),
    ("ok", "boolean", True), ("at", "timestamp", True), ("day", "date", True),
    ("clock", "time", True), ("ref", "uuid", True), ("blob", "binary", True),
    ("amount", "decimal(12,2)", True), ("colour", "string", True), ("level", "long", True),
    ("kind", "string", True),
    ("lines", "list<struct<sku: string, price: decimal(9,2), qty: long>>", True),
    ("counts", "map<string,long>", True), ("meta", "json", True), ("anything", "json", True),
    ("nested_lists", "list<list<string>>", True), ("maybe", "string", False),
    ("note", "string", False)]


def test_every_annotation_maps_to_its_column_type() -> None:
    stream = icefloe.define(Everything, stream="everything", table="typed.everything")
    assert [(c.name, c.type, c.required) for c in stream.columns] == EVERYTHING_COLUMNS
    assert stream.config.primary_key == ("id",)
    assert stream.config.unknown_fields == "reject"
    docs = {c.name: c.doc for c in stream.columns if c.doc}
    assert docs == {"id": "The id; the table keeps the latest row per id.",
                    "note": "free text"}
    assert stream.description == "Every annotation the mapping knows."


class PyLine(pydantic.BaseModel):
    sku: str
    price: Annotated[Decimal, icefloe.Precision(9, 2)]


class PyOrder(pydantic.BaseModel):
    """An order, as a pydantic model."""

    order_id: icefloe.Key[str] = pydantic.Field(description="the order's id")
    region: icefloe.Key[str]
    amount: Money
    placed_at: dt.datetime
    lines: list[PyLine]
    coupon: str | None = None
    tags: dict[str, str] = pydantic.Field(default_factory=dict)


def test_a_pydantic_model_maps_like_a_dataclass() -> None:
    stream = icefloe.define(PyOrder, stream="py-orders", table="typed.py_orders")
    assert [(c.name, c.type, c.required, c.doc) for c in stream.columns] == [
        ("order_id", "string", True, "the order's id"), ("region", "string", True, ""),
        ("amount", "decimal(12,2)", True, ""), ("placed_at", "timestamp", True, ""),
        ("lines", "list<struct<sku: string, price: decimal(9,2)>>", True, ""),
        ("coupon", "string", False, ""), ("tags", "map<string,string>", True, "")]
    assert stream.config.primary_key == ("order_id", "region")
    assert stream.description == "An order, as a pydantic model."


@dataclass
class Node:
    name: str
    children: list[Node]


@dataclass
class HasTree:
    root: Node


class NotAModel:
    a: int


def _model(annotation: Any) -> type:
    """A dataclass ``Bad`` whose one field ``f`` has ``annotation`` (made at run time)."""
    return dataclasses.make_dataclass("Bad", [("f", annotation)])


@pytest.mark.parametrize(("annotation", "named"), [
    (int | str, "Bad.f: int | str is a union of several types"),
    (Optional[int | str], "Bad.f: Union[int, str, None] is a union"),  # noqa: UP045
    (set[str], "Bad.f: set[str] is not supported: a set has no column type"),
    (frozenset[int], "Bad.f: frozenset[int] is not supported: a set"),
    (tuple[int, str], "Bad.f: tuple[int, str] is not supported: a tuple has no column type"),
    (dict[int, str], "Bad.f: dict[int, str] is not supported: map keys must be str"),
    (dict[int, Any], "Bad.f: dict[int, Any]: keys must be str"),
    (Decimal, "Bad.f: a bare Decimal has no precision"),
    (list[Decimal], "Bad.f[]: a bare Decimal has no precision"),
    (Annotated[int, icefloe.Precision(5, 1)], "Bad.f: icefloe.Precision applies to Decimal"),
    (Optional[icefloe.Key[str]], "Bad.f: a Key field cannot be optional"),  # noqa: UP045
    (list[icefloe.Key[str]], "Bad.f[]: Key marks a top-level field"),
    (list, "Bad.f: a bare list has no element type"),
    (NotAModel, "Bad.f: NotAModel is not supported"),
    (complex, "Bad.f: complex is not supported"),
    (HasTree, "Bad.f.root.children[]: Node contains itself (a recursive model)"),
    (Literal["a", 1], "Bad.f: Literal['a', 1] mixes value types"),
])
def test_an_unsupported_annotation_is_refused_naming_the_field_and_type(
        annotation: Any, named: str) -> None:
    with pytest.raises(ModelError) as refused:
        icefloe.define(_model(annotation), stream="bad", table="typed.bad")
    assert str(refused.value).startswith(named), str(refused.value)


def test_an_annotation_that_does_not_resolve_is_refused_naming_the_field() -> None:
    @dataclass
    class Local:
        name: str

    @dataclass
    class UsesLocal:
        ok: int
        inner: Local
    with pytest.raises(ModelError, match=r"^UsesLocal\.inner \(Local\): the annotation names "
                                         r"something not defined at module level"):
        icefloe.define(UsesLocal, stream="u", table="typed.u")


def test_the_stream_rules_of_the_config_apply_to_a_model() -> None:
    @dataclass
    class FloatKey:
        k: icefloe.Key[float]
    with pytest.raises(ConfigError, match=r"primary_key\[0\]: column 'k' .* type 'double'"):
        icefloe.define(FloatKey, stream="fk", table="typed.fk")
    with pytest.raises(ConfigError, match=r"table: 'nodot' must be 'namespace.table'"):
        icefloe.define(Line, stream="lines", table="nodot")
    with pytest.raises(ModelError, match="NotAModel is not a dataclass or a pydantic model"):
        icefloe.define(NotAModel, stream="x", table="typed.x")
    with pytest.raises(ModelError, match=r"Precision\(3, 4\): scale must be 0..precision"):
        icefloe.Precision(3, 4)


def test_to_toml_is_a_streams_block_that_load_config_reads_back(tmp_path: Path) -> None:
    stream = icefloe.define(Everything, stream="everything", table="typed.everything",
                            partition_by=["day(at)"], sort_by=["n"],
                            table_properties={"write.parquet.compression-codec": "zstd"})
    text = stream.to_toml()
    assert text.startswith('[[streams]]\nname = "everything"\ntable = "typed.everything"\n')
    assert '  { name = "note", type = "string", doc = "free text" },\n' in text
    path = tmp_path / "icefloe.toml"
    path.write_text(f'[store]\nurl = "{(tmp_path / "store").as_uri()}"\n\n{text}')
    (loaded,) = load_config(path).streams
    assert loaded == stream.config


@dataclass
class WithSet:
    tags: set[str]


def test_the_cli_prints_the_block_or_refuses_naming_the_field(
        capsys: pytest.CaptureFixture[str]) -> None:
    from icefloe_app.cli import main

    assert main(["define", "tests.typed.test_define:Everything", "--stream", "everything",
                 "--table", "typed.everything"]) == 0
    assert capsys.readouterr().out == icefloe.define(
        Everything, stream="everything", table="typed.everything").to_toml()
    assert main(["define", "tests.typed.test_define:WithSet", "--stream", "s",
                 "--table", "typed.s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("icefloe: error: WithSet.tags: set[str] is not supported"), err
    assert len(err.splitlines()) == 1
    assert main(["define", "tests.typed.test_define:Nope", "--stream", "s",
                 "--table", "typed.s"]) == 2
    assert "module 'tests.typed.test_define' has no class 'Nope'" in capsys.readouterr().err


def test_instances_encode_to_the_canonical_json_of_their_columns() -> None:
    stream = icefloe.define(Everything, stream="everything", table="typed.everything")
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    event = Everything(
        id="e1", n=2**40, x=1.5, ok=True,
        at=dt.datetime(2026, 12, 2, 9, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        day=dt.date(2026, 12, 2), clock=dt.time(7, 5, 3, 250), ref=ref, blob=b"\x00\xff",
        amount=Decimal("12.50"), colour=Colour.BLUE, level=Level.HIGH, kind="b",
        lines=[Line("s1", Decimal("1.500")), Line("s2", Decimal(3), qty=2)],
        counts={"a": 1}, meta={"k": [1, None]}, anything=[1, "x"],
        nested_lists=[["a"], []], maybe=None)
    assert msgspec.json.decode(stream.encode(event)) == {
        "id": "e1", "n": 2**40, "x": 1.5, "ok": True, "at": "2026-12-02T07:30:00Z",
        "day": "2026-12-02", "clock": "07:05:03.000250", "ref": str(ref),
        "blob": base64.b64encode(b"\x00\xff").decode(), "amount": "12.50",
        "colour": "blue", "level": 2, "kind": "b",
        "lines": [{"sku": "s1", "price": "1.50"}, {"sku": "s2", "price": "3", "qty": 2}],
        "counts": {"a": 1}, "meta": {"k": [1, None]}, "anything": [1, "x"],
        "nested_lists": [["a"], []]}


@pytest.mark.parametrize(("change", "named"), [
    ({"at": dt.datetime(2026, 12, 2, 9, 30)}, "Everything.at: naive datetime"),
    ({"amount": Decimal("1.005")}, "Everything.amount: 1.005 has more than 2 digits after"),
    ({"amount": Decimal("12345678901")}, "Everything.amount: 12345678901 has more than 10 "
                                         "digits before"),
    ({"amount": Decimal("NaN")}, "Everything.amount: NaN is not a finite decimal"),
    ({"x": float("nan")}, "Everything.x: nan is not a finite number"),
    ({"x": float("-inf")}, "Everything.x: -inf is not a finite number"),
    ({"lines": [Line("s", Decimal("0.001"))]}, "Everything.lines[0].price: 0.001 has more"),
    ({"clock": dt.time(1, 2, tzinfo=UTC)}, "Everything.clock: time 01:02:00+00:00 has a "
                                           "time zone"),
    ({"lines": ["not a line"]}, "Everything.lines[0]: expected a Line, got str"),
])
def test_a_value_no_column_can_hold_is_refused_before_sending(change: dict[str, Any],
                                                              named: str) -> None:
    stream = icefloe.define(Everything, stream="everything", table="typed.everything")
    event = dataclasses.replace(_an_everything(), **change)
    with pytest.raises(ModelError) as refused:
        stream.encode(event)
    assert str(refused.value).startswith(named), str(refused.value)
    with pytest.raises(ModelError, match="stream 'everything' takes Everything instances, "
                                         "got Line"):
        stream.encode(Line("s", Decimal(1)))  # type: ignore[arg-type]


def _an_everything() -> Everything:
    return Everything(id="e", n=1, x=0.5, ok=False, at=dt.datetime.now(UTC),
                      day=dt.date(2026, 1, 1), clock=dt.time(1), ref=uuid.uuid4(), blob=b"",
                      amount=Decimal("1.00"), colour=Colour.RED, level=Level.LOW, kind="a",
                      lines=[], counts={}, meta={}, anything=None, nested_lists=[],
                      maybe="m")


def test_evolution_rules_for_producers() -> None:
    old = (Column("id", "string", required=True), Column("a", "long"),
           Column("b", "string", required=True))
    columns, added, kept = evolve_columns("M", old, (
        Column("id", "string", required=True), Column("b", "string"), Column("c", "date")))
    assert [c.name for c in columns] == ["id", "b", "c", "a"]  # a: removed, optional, kept
    assert (added, kept) == (("c",), ("a",))
    with pytest.raises(ModelError, match=r"M\.b: the field was removed, but the registered "
                                         "stream requires it"):
        evolve_columns("M", old, (Column("id", "string", required=True),))
    with pytest.raises(ModelError, match=r"M\.c: a new field must be optional"):
        evolve_columns("M", old, (*old, Column("c", "long", required=True)))
    with pytest.raises(ModelError, match=r"M\.a: an optional field cannot become required"):
        evolve_columns("M", old, (old[0], Column("a", "long", required=True), old[2]))


def test_an_admin_api_that_does_not_answer_is_a_registry_error_saying_so() -> None:
    port = free_port()
    with pytest.raises(RegistryError) as refused:
        icefloe.define(Line, stream="lines", table="typed.lines").register(
            f"http://127.0.0.1:{port}", ADMIN_TOKEN, timeout=5)
    assert (refused.value.status, refused.value.code) == (503, "unreachable")
    assert f"the admin API at http://127.0.0.1:{port} did not answer" in str(refused.value)


# -- end to end: admin API, ingestor (HTTP + gRPC), collector, the table --------------------


@dataclass
class Order:
    """An order placed in the shop."""

    order_id: icefloe.Key[str]
    amount: Money
    placed_at: dt.datetime
    lines: list[Line]
    ref: uuid.UUID
    coupon: str | None = None


@dataclass
class OrderV2:
    """Order with a new optional field (the class as changed by its owner)."""

    order_id: icefloe.Key[str]
    amount: Money
    placed_at: dt.datetime
    lines: list[Line]
    ref: uuid.UUID
    coupon: str | None = None
    channel: str | None = None


@dataclass
class OrderRetyped:
    """Order whose amount became a string: the table cannot follow."""

    order_id: icefloe.Key[str]
    amount: str
    placed_at: dt.datetime
    lines: list[Line]
    ref: uuid.UUID
    coupon: str | None = None
    channel: str | None = None


@dataclass
class Stack:
    config: Config
    admin_url: str


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """The real admin API (registry polled every 0.2 s) on a local store and SQLite
    catalog."""
    base = collector_config(tmp_path, ())
    config = msgspec.structs.replace(base, admin=msgspec.structs.replace(
        base.admin, port=0, tokens=(hash_token(ADMIN_TOKEN, log2_n=10),),
        registry_poll_s=0.2))
    with admin_server(config) as url:
        yield Stack(config, url)


@dataclass
class Ingestor:
    http: str
    grpc: str
    runtime: Any

    def serves(self, version: int) -> None:
        """Wait until the ingestor has applied registry ``version`` (it polls)."""
        deadline = time.monotonic() + 30
        while self.runtime.service.registry_version < version:
            assert time.monotonic() < deadline, "the ingestor never saw the new registry"
            time.sleep(0.05)


@contextmanager
def ingestor(config: Config) -> Iterator[Ingestor]:
    """A real ingestor runtime serving HTTP and gRPC from a thread of its own (the typed
    client is synchronous)."""
    state: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        stop = asyncio.Event()
        state["stop"], state["loop"] = stop, asyncio.get_running_loop()
        async with grpc_serving(config) as (runtime, served), http_serving(runtime) as url:
            state["ingestor"] = Ingestor(url, f"127.0.0.1:{served.port}", runtime)
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    assert "error" not in state, state.get("error")
    try:
        yield state["ingestor"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
    assert "error" not in state, state.get("error")


def collect(config: Config) -> None:
    from pipeline.load.run import LocalEngine

    asyncio.run(collect_all(config, LocalEngine()))


def query(config: Config, capsys: pytest.CaptureFixture[str], sql: str) -> Any:
    """``icefloe query --format json SQL`` over ``config``'s catalog: its rows."""
    from icefloe_app.cli import main

    path = Path(config.source).with_name("query.toml")
    path.write_text(f'[catalog]\nuri = "{config.catalog.uri}"\n'
                    f'warehouse = "{config.catalog.warehouse}"\n'
                    f'[store]\nurl = "{config.store.url}"\n')
    capsys.readouterr()
    assert main(["query", "--config", str(path), "--format", "json", sql]) == 0
    return msgspec.json.decode(capsys.readouterr().out)


def rows_by(config: Config, table: str, key: str) -> dict[Any, dict[str, Any]]:
    return {r[key]: r for r in read_table(config, table).to_pylist()}


def test_a_dataclass_registers_fills_its_table_over_http_and_grpc_and_evolves(
        stack: Stack, capsys: pytest.CaptureFixture[str], spark: Any) -> None:
    orders = icefloe.define(Order, stream="orders", table="shop.orders")
    created = orders.register(stack.admin_url, ADMIN_TOKEN)
    assert (created.action, created.added) == ("created", (
        "order_id", "amount", "placed_at", "lines", "ref", "coupon"))
    assert orders.register(stack.admin_url, ADMIN_TOKEN).action == "unchanged"

    at = dt.datetime(2026, 12, 2, 8, 0, 0, 123456, tzinfo=UTC)
    sent = [Order(f"o{i}", Decimal(f"{i}.25"), at + dt.timedelta(seconds=i),
                  [Line("sku", Decimal("9.99"), qty=i)], uuid.uuid4(),
                  coupon="TEN" if i % 2 else None) for i in range(4)]
    with ingestor(stack.config) as ing:
        with orders.client(ing.http) as http:
            assert http.send(sent[0]) == 1
            assert http.send_many(sent[1:2]) == 1
        with orders.client(ing.grpc, transport="grpc") as grpc:
            assert grpc.send_many(sent[2:]) == 2

        # a bad value is refused by the client, naming the field; nothing is sent
        with orders.client(ing.http) as http, pytest.raises(ModelError,
                                                            match=r"Order\.placed_at: naive"):
            http.send(dataclasses.replace(sent[0], order_id="bad",
                                          placed_at=dt.datetime(2026, 1, 1)))
        collect(stack.config)

        rows = rows_by(stack.config, "shop.orders", "order_id")
        assert sorted(rows) == ["o0", "o1", "o2", "o3"]
        for order in sent:
            row = rows[order.order_id]
            assert row["amount"] == order.amount
            assert row["placed_at"] == order.placed_at
            assert row["ref"] in (order.ref, order.ref.bytes, str(order.ref))
            assert row["coupon"] == order.coupon
            assert row["lines"] == [{"sku": "sku", "price": Decimal("9.99"),
                                     "qty": order.lines[0].qty}]

        # the class gains an optional field: registering again adds the column
        orders2 = icefloe.define(OrderV2, stream="orders", table="shop.orders")
        evolved = orders2.register(stack.admin_url, ADMIN_TOKEN)
        assert (evolved.action, evolved.added) == ("evolved", ("channel",))
        ing.serves(evolved.version)
        newer = [OrderV2("o9", Decimal("1.00"), at, [], uuid.uuid4(), channel="web"),
                 OrderV2("o10", Decimal("2.00"), at, [], uuid.uuid4())]
        with orders2.client(ing.grpc, transport="grpc") as grpc:
            assert grpc.send(newer[0]) == 1
        with orders2.client(ing.http) as http:
            assert http.send(newer[1]) == 1
        collect(stack.config)

        rows = rows_by(stack.config, "shop.orders", "order_id")
        assert {k: r["channel"] for k, r in rows.items()} == {
            "o0": None, "o1": None, "o2": None, "o3": None, "o9": "web", "o10": None}
        assert rows["o9"]["amount"] == Decimal("1.00")
        assert query(stack.config, capsys, "SELECT order_id, amount, channel FROM shop.orders "
                     "WHERE order_id IN ('o1', 'o9') ORDER BY order_id") == [
            {"order_id": "o1", "amount": "1.25", "channel": None},
            {"order_id": "o9", "amount": "1.00", "channel": "web"}]
        from pipeline.read.iceberg_source import read_table as spark_read_table

        frame = spark_read_table(spark, stack.config.catalog, "shop.orders")  # and Spark
        on_spark = {r["order_id"]: r.asDict(recursive=True) for r in frame.collect()}
        assert {k: (r["amount"], r["channel"]) for k, r in on_spark.items()} == {
            k: (r["amount"], r["channel"]) for k, r in rows.items()}
        assert on_spark["o2"]["lines"] == [{"sku": "sku", "price": Decimal("9.99"), "qty": 2}]

        # a changed type is refused by the table task, naming the field; nothing changes
        retyped = icefloe.define(OrderRetyped, stream="orders", table="shop.orders")
        with pytest.raises(RegistryError) as refused:
            retyped.register(stack.admin_url, ADMIN_TOKEN)
        assert "column 'amount' is decimal(12,2) in the table but configured as string" \
            in str(refused.value), str(refused.value)
        assert refused.value.code == "table"
        assert orders2.register(stack.admin_url, ADMIN_TOKEN).action == "unchanged"

        # so is a changed key (the server's 409, surfaced as it answered)
        @dataclass
        class Rekeyed:
            order_id: icefloe.Key[str]
            amount: Money
            placed_at: dt.datetime
            lines: list[Line]
            ref: icefloe.Key[uuid.UUID]
            coupon: str | None = None
            channel: str | None = None
        with pytest.raises(RegistryError) as rekeyed:
            icefloe.define(Rekeyed, stream="orders", table="shop.orders").register(
                stack.admin_url, ADMIN_TOKEN)
        assert (rekeyed.value.status, rekeyed.value.code) == (409, "primary_key_fixed")
        assert "sink.primary_key: the upsert key of a live table cannot change" in str(
            rekeyed.value)

        # a removed required field is refused here (the server would accept it)
        @dataclass
        class Shrunk:
            order_id: icefloe.Key[str]
            amount: Money
        with pytest.raises(ModelError, match=r"Shrunk\.placed_at: the field was removed"):
            icefloe.define(Shrunk, stream="orders", table="shop.orders").register(
                stack.admin_url, ADMIN_TOKEN)

        # the ingestor's refusal of an event surfaces with its status and details (a
        # looser class sent to the same stream: a uuid column given text that is none)
        @dataclass
        class Loose:
            order_id: str
            amount: str
            placed_at: str
            lines: list[str]
            ref: str
        loose = icefloe.define(Loose, stream="orders", table="shop.loose")
        with loose.client(ing.http) as http, pytest.raises(IngestRejected) as rejected:
            http.send(Loose("o", "1.00", "2026-12-02T00:00:00Z", [], "not-a-uuid"))
        assert rejected.value.status == 400
        assert [d["field"] for d in rejected.value.details] == ["ref"]


def test_a_pydantic_model_registers_and_fills_its_table(stack: Stack) -> None:
    orders = icefloe.define(PyOrder, stream="py-orders", table="shop.py_orders")
    assert orders.register(stack.admin_url, ADMIN_TOKEN).action == "created"
    at = dt.datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    sent = [PyOrder(order_id="p1", region="eu", amount=Decimal("3.10"), placed_at=at,
                    lines=[PyLine(sku="a", price=Decimal("1.55"))], tags={"vip": "yes"}),
            PyOrder(order_id="p1", region="us", amount=Decimal("4.00"), placed_at=at,
                    lines=[], coupon="X")]
    with ingestor(stack.config) as ing, orders.client(ing.grpc, transport="grpc") as client:
        assert client.send_many(sent) == 2
        collect(stack.config)
    rows = {(r["order_id"], r["region"]): r
            for r in read_table(stack.config, "shop.py_orders").to_pylist()}
    assert rows[("p1", "eu")]["amount"] == Decimal("3.10")
    assert rows[("p1", "eu")]["lines"] == [{"sku": "a", "price": Decimal("1.55")}]
    assert dict(rows[("p1", "eu")]["tags"]) == {"vip": "yes"}
    assert rows[("p1", "us")]["coupon"] == "X"
    assert rows[("p1", "us")]["placed_at"] == at
