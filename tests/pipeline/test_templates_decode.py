"""``template`` columns in the collector's decode (what the executors run per batch file):
a failing ``Body(path)`` drops that record into the dead letters with Keboola's reason and
the event's JSON text, the other records of the file land; and each entry is evaluated
with the template its registry version declares (:class:`TemplateCase`), null where none.
Real batch files as the ingestor writes them (its validator, the envelope, the batch
format) and the real ``jsonnet`` library."""

from __future__ import annotations

import msgspec
import pyarrow as pa

from icefloe.config import Column, StreamConfig
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_events
from ingestor.validate import CompiledStream
from pipeline.load.decode import DeadLetters, decode_batch_file
from pipeline.load.spec import (
    EntryFile,
    RunSpec,
    TemplateCase,
    stream_specs,
    with_template_cases,
)

RECEIVED_MS = 1673683445123
ISSUES = StreamConfig(name="issues", table="in_c_github.issues", columns=(
    Column("n", "string", path="$.n"),
    Column("v", "string", template="'#' + Body('issue.id') + ' ' + Ip()")))


def batch(stream: StreamConfig, events: list[dict[str, object]]) -> bytes:
    """One request of ``events`` from 203.0.113.9, framed as the ingestor frames it."""
    compiled = CompiledStream(stream)
    meta = compiled.request_meta("203.0.113.9", {"user-agent": "test/1.0"}.get)
    payloads = compiled.from_json(msgspec.json.encode(events)).payloads
    builder = BatchBuilder()
    builder.add_framed(frame_events(stream.name, RECEIVED_MS,
                                    [f"e{i}" for i in range(len(events))], payloads,
                                    meta=meta), len(events))
    return builder.finish()


def decode(data: bytes, sequence: int, spec: RunSpec | None = None) -> tuple[pa.Table, DeadLetters]:
    streams = spec.streams if spec is not None else stream_specs([ISSUES])
    decoded = decode_batch_file(data, EntryFile(sequence, "k", len(data), 0),
                                {s.name: s.plan() for s in streams})
    return decoded.tables["issues"], decoded.dead


EVENTS = [{"n": "a", "issue": {"id": "7"}}, {"n": "b", "issue": {}},
          {"n": "c", "issue": {"id": "9"}}]


def test_a_failing_body_path_dead_letters_the_record_with_its_reason() -> None:
    table, dead = decode(batch(ISSUES, EVENTS), 4)
    assert table.select(["n", "v"]).to_pylist() == [
        {"n": "a", "v": '"#7 203.0.113.9"'}, {"n": "c", "v": '"#9 203.0.113.9"'}]
    assert dead.reason == ["template_error"]
    assert dead.event_id == ["e1"]
    assert dead.sequence == [4]
    assert dead.message == ["column 'v' of stream 'issues': path \"issue.id\" not found "
                               "in the body"]
    assert msgspec.json.decode(dead.raw[0]) == {"n": "b", "issue": {}}


def test_each_entry_takes_the_template_of_its_own_version() -> None:
    spec = RunSpec(store_url="file:///x", endpoint_url=None, region=None,
                   streams=stream_specs([ISSUES]), batches=())
    spec = with_template_cases(spec, {"issues": {"v": (
        TemplateCase("'old ' + Body('n')", ((1, 2),)),
        TemplateCase("'new ' + Body('n')", ((3, 3), (5, 5))))}})
    data = batch(ISSUES, [{"n": "a"}])
    assert decode(data, 2, spec)[0].column("v").to_pylist() == ['"old a"']
    assert decode(data, 5, spec)[0].column("v").to_pylist() == ['"new a"']
    table, dead = decode(data, 4, spec)  # no version of entry 4 declares one: null
    assert table.column("v").to_pylist() == [None]
    assert dead.reason == []


def test_a_redriven_dead_letter_never_stores_the_body_text_as_the_template_value() -> None:
    """A redrive re-decodes a dead letter's canonical payload, where a template column's
    field holds the event's JSON text (the template's input, not its value): the column
    must be null there (the request data and the version's template are not kept with a
    dead letter), never that text."""
    from pipeline.load.decode import decode_payload_rows
    from pipeline.redrive import _with_derived

    plan = stream_specs([ISSUES])[0].plan()
    line = msgspec.json.encode({"n": "a", "v": '{"n":"a","issue":{"id":"7"}}'})
    decoded, bad = decode_payload_rows([line], ["e0"], [RECEIVED_MS], [3], plan.payload)
    assert bad == []
    rows = _with_derived(decoded, plan).to_pylist()
    assert [(r["n"], r["v"]) for r in rows] == [("a", None)]
