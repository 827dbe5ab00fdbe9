"""The compiled hot loops (``icefloe/formats/_speedups.pyx``) against their pure-Python references:
same bytes, same indexes, same refusals — and they are really built where CI runs."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icefloe.formats.envelope import _frame_py, decode_envelope, frame_encoded
from icefloe.formats.speedups import ENV, compiled
from ingestor.validate import _not_utc_py

needs_compiled = pytest.mark.skipif(compiled is None, reason="speedups not built "
                                    "(scripts/build_speedups.py, run by make)")

ids_bytes = st.binary(min_size=0, max_size=20)
payload_bytes = st.binary(min_size=1, max_size=60).filter(
    lambda p: b"\n" not in p and b"\r" not in p)


def test_should_be_built_where_a_compiler_is():
    """CI runs `make test`, which builds them: a build that silently fell back to Python
    would make every benchmark figure a lie."""
    if compiled is not None:
        return
    if os.environ.get("CI") and shutil.which("cc"):
        pytest.fail("icefloe.formats._speedups is not built although a C compiler is here: run "
                    "`.venv/bin/python scripts/build_speedups.py` and read its error")
    pytest.skip("speedups not built (no CI, or no compiler)")


def test_should_build_the_otlp_wire_decoder_with_them():
    """The OTLP receivers' compiled decoder (icefloe/otlp/_wire.pyx) is built by the same
    script: where the framing loops are built, it must be too."""
    from icefloe.otlp.wire import compiled as wire  # why: only this test needs it
    if compiled is not None:
        assert wire is not None, "icefloe.otlp._wire is not built: run scripts/build_speedups.py"


def test_should_turn_off_with_the_environment_variable():
    code = ("from icefloe.formats.speedups import compiled; "
            "from icefloe.otlp.wire import compiled as wire; print(compiled is wire is None)")
    out = subprocess.run([sys.executable, "-c", code], env=os.environ | {ENV: "0"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(stem=ids_bytes, suffixes=st.lists(ids_bytes, min_size=1, max_size=12),
       payloads=st.lists(payload_bytes, min_size=1, max_size=12),
       tail=st.sampled_from([b"", b"\x05\x00\x00\x00{\"a\"}"]))
def test_should_frame_exactly_like_the_python_reference(stem, suffixes, payloads, tail):
    payloads = payloads[:len(suffixes)]
    if not stem:
        suffixes = suffixes[:len(payloads)]
    if any(len(stem) + len(s) == 0 for s in suffixes[:len(payloads)]):
        return  # an empty id: the ingestor never builds one (frame_events refuses it)
    prefix = b"\x01\x00" + b"\x00" * 8 + b"\x02ab"
    assert compiled.frame(prefix, stem, tuple(suffixes), list(payloads), tail) == \
        _frame_py(prefix, stem, suffixes, payloads, tail)


@needs_compiled
def test_should_frame_records_that_decode_back():
    """Through the public function: each record is an envelope with the stem + suffix id,
    the meta and the payload (so the compiled path speaks the documented format)."""
    payloads = [b'{"n":%d}' % i for i in range(12)]
    suffixes = tuple(b"-%d" % i for i in range(1024))
    framed = frame_encoded("pageviews", 1_700_000_000_123, suffixes, payloads,
                           meta=b'{"ip":"1.2.3.4"}', stem=b"01JSTEM")
    at, records = 0, []
    while at < len(framed):
        size = int.from_bytes(framed[at:at + 4], "little")
        records.append(decode_envelope(framed[at + 4:at + 4 + size]))
        at += 4 + size
    assert [r.event_id for r in records] == [f"01JSTEM-{i}" for i in range(12)]
    assert [r.payload for r in records] == payloads
    assert {r.meta for r in records} == {b'{"ip":"1.2.3.4"}'}
    assert {r.received_at_ms for r in records} == {1_700_000_000_123}


@needs_compiled
@pytest.mark.parametrize(("stem", "ids", "payloads", "error", "match"), [
    (b"s" * 250, (b"-123456",), [b"{}"], ValueError, "at most 255"),
    (b"", (b"a",), [b"{}", b"{}"], ValueError, "1 event ids for 2 payloads"),
    (b"", ("a",), [b"{}"], TypeError, "bytes"),
    (b"", (b"a",), [bytearray(b"{}")], TypeError, "bytes"),
])
def test_should_refuse_what_the_format_cannot_hold(stem, ids, payloads, error, match):
    with pytest.raises(error, match=match):
        compiled.frame(b"\x01", stem, ids, payloads, b"")


def test_should_refuse_too_few_ids_on_either_path():
    with pytest.raises(ValueError, match="1 event ids for 2 payloads"):
        frame_encoded("s", 0, [b"a"], [b"{}", b"{}"])
    with pytest.raises(ValueError, match="1 event ids for 2 payloads"):
        frame_encoded("s", 0, [b"a"], [b"{}", b"{}"], stem=b"x")


class Stamped(msgspec.Struct):
    ts: Any = None


class SubDatetime(dt.datetime):
    pass


@needs_compiled
def test_should_find_the_same_timestamps_to_convert_as_the_python_reference():
    utc = dt.datetime(2026, 11, 25, 1, 2, 3, tzinfo=dt.UTC)
    values = [utc, dt.datetime(2026, 11, 25, tzinfo=dt.timezone(dt.timedelta(hours=2))),
              dt.datetime(2026, 11, 25), 1_700_000_000_000, None, "x",
              SubDatetime(2026, 11, 25, tzinfo=dt.UTC), utc]
    events = [Stamped(value) for value in values]
    assert compiled.not_utc(events, "ts", dt.UTC) == _not_utc_py(events, "ts")
    assert _not_utc_py(events, "ts") == [1, 2, 3, 4, 5, 6]  # all but the UTC datetimes


def test_the_build_should_say_so_and_pass_without_a_compiler():
    """`make up` must still work on a machine without gcc: pure Python, and one line that
    says what is missing (the module already built in this tree stays untouched)."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "scripts/build_speedups.py"], cwd=root,
                            env=os.environ | {"PATH": "/nonexistent"}, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0
    assert "no C compiler found" in result.stderr
