"""Secrets never reach a log line: URL passwords, bearer tokens, secret parameters."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from icefloe.logs import setup_logging
from icefloe.redact import mask_uri, redact


@pytest.mark.parametrize(("text", "masked"), [
    ("postgresql://icefloe:s3cret@db:5432/icefloe", "postgresql://icefloe:***@db:5432/icefloe"),
    ("cannot open postgresql://u:p@ss:w0rd@db/x?sslmode=require&password=pw2 now",
     "cannot open postgresql://u:***@db/x?sslmode=require&password=*** now"),
    ("Authorization: Bearer ifl_abc.DEF-123", "Authorization: Bearer ***"),
    ("{'authorization': 'bearer xyz'}", "{'authorization': 'bearer ***'}"),
    ("s3://bucket/key?X-Amz-Credential=AKIA/x&X-Amz-Signature=1",
     "s3://bucket/key?X-Amz-Credential=***&X-Amz-Signature=1"),
    ("http://minio:9000/bucket", "http://minio:9000/bucket"),  # nothing to mask
    ("sqlite:////var/lib/icefloe/catalog.db", "sqlite:////var/lib/icefloe/catalog.db"),
    ("user@example.com wrote a=b", "user@example.com wrote a=b"),
    # the key at the very start, dicts and JSON echoed in errors, compound keys with ':'
    ("password=hunter2 rejected", "password=*** rejected"),
    ("AWS_SECRET_ACCESS_KEY=abc/def+g", "AWS_SECRET_ACCESS_KEY=***"),
    ("{'credential': 'id:s3cret', 'uri': 'http://rest'}", "{'credential': '***', 'uri': 'http://rest'}"),
    ('{"password": "x"}', '{"password": "***"}'),
    ("client_secret: abc", "client_secret: ***"),
    ("needs a write token: send one", "needs a write token: send one"),  # prose, not a key
    # an icefloe token anywhere, with or without a scheme in front of it
    ("got ifl_AbCdEf0123456789-_xyz in a header", "got ifl_*** in a header"),
])
def test_should_mask_secrets_in_free_text(text, masked):
    assert redact(text) == masked


def test_should_mask_a_uri_it_knows_is_one():
    assert mask_uri("postgresql://u:pw@h:5432/db?sslmode=require&password=x") == \
        "postgresql://u:***@h:5432/db?sslmode=require&password=***"


@pytest.fixture
def root_logger() -> Iterator[None]:
    """``setup_logging`` replaces the root logger's handlers: put them back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_should_redact_every_log_line_as_the_last_line_of_defence(root_logger, capsys, fmt):
    setup_logging("info", fmt)  # a handler on the stderr pytest captures now
    log = logging.getLogger("icefloe.test")
    log.info("connecting to %s", "postgresql://icefloe:pw-in-args@db/icefloe")
    log.warning("echoed header", extra={"header": "Bearer ifl_in-an-extra-field"})
    try:
        raise RuntimeError("could not connect to postgresql://u:pw-in-traceback@db/x")
    except RuntimeError:
        log.exception("catalog failed")
    out = capsys.readouterr().err
    for secret in ("pw-in-args", "ifl_in-an-extra-field", "pw-in-traceback"):
        assert secret not in out
    assert "postgresql://icefloe:***@db/icefloe" in out
    assert "RuntimeError: could not connect to postgresql://u:***@db/x" in out
    if fmt == "json":
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert lines[1]["header"] == "Bearer ***"
        assert lines[2]["msg"] == "catalog failed"


def test_should_mask_secrets_in_the_one_line_cli_error():
    from icefloe.errors import IcefloeError
    from icefloe_app.cli import _describe

    line = _describe(IcefloeError("cannot open postgresql://icefloe:pw-in-error@db/x\nmore"))
    assert line == "cannot open postgresql://icefloe:***@db/x"


def test_should_send_uvicorn_lines_through_the_redacting_handler(root_logger, capsys):
    from icefloe.config import IngestorSection
    from ingestor.http.server import http_config, slow_client_guard

    # as in a fresh ingestor process: earlier tests in this pytest process may have run a
    # uvicorn server with uvicorn's default logging, which leaves its own handlers behind
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers[:], lg.propagate = [], True
    try:
        setup_logging("info", "json")
        ing = IngestorSection()
        http_config(object(), ing, slow_client_guard(ing))  # uvicorn configures logging here
        logging.getLogger("uvicorn.error").warning("Invalid header: Bearer ifl_uvicorn-secret")
    finally:
        for lg, (handlers, propagate) in zip(loggers, saved, strict=True):
            lg.handlers[:], lg.propagate = handlers, propagate
    out = capsys.readouterr().err
    assert "ifl_uvicorn-secret" not in out
    assert json.loads(out.strip().splitlines()[-1])["msg"] == "Invalid header: Bearer ***"


def test_should_redact_tokens_nested_in_non_string_log_extras(root_logger, capsys):
    """Dicts, lists, tuples and bytes in extra fields reach the JSON line redacted, however
    deep; a secret-named key's value is masked whole; plain values keep their type."""
    setup_logging("info", "json")
    logging.getLogger("icefloe.test").warning("request refused", extra={
        "headers": {"authorization": "Bearer ifl_in-a-dict", "x-count": 3},
        "hops": ["10.0.0.1", ("Bearer ifl_in-a-tuple-in-a-list", None)],
        "body": b'{"token": "raw-bytes-secret", "x": "\xff"} ifl_in-bytes-1234',
        "deep": {"a": [{"b": {"password": "pw-deep-down", "ok": True}}]},
        "client_secret": "plain-secret-extra",
        "rows": 7,
    })
    out = capsys.readouterr().err
    for secret in ("ifl_in-a-dict", "ifl_in-a-tuple-in-a-list", "raw-bytes-secret",
                   "ifl_in-bytes-1234", "pw-deep-down", "plain-secret-extra"):
        assert secret not in out
    line = json.loads(out.strip().splitlines()[-1])
    assert line["headers"] == {"authorization": "Bearer ***", "x-count": 3}
    assert line["hops"] == ["10.0.0.1", ["Bearer ***", None]]
    assert line["deep"] == {"a": [{"b": {"password": "***", "ok": True}}]}
    assert line["client_secret"] == "***"
    assert line["rows"] == 7
    assert line["body"].startswith('{"token": "***"')


def test_should_end_redaction_of_a_structure_that_contains_itself():
    from icefloe.redact import MASK, redact_value

    loop: list[object] = ["Bearer abc"]
    loop.append(loop)
    redacted = redact_value(loop)
    assert redacted[0] == "Bearer ***"
    depth, node = 0, redacted
    while isinstance(node, list):
        node, depth = node[1], depth + 1
    assert node == MASK
    assert depth < 20
