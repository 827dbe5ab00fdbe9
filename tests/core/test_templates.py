"""``template`` columns' Jsonnet globals, one by one, with the semantics Keboola's Data
Streams documentation gives them (developers.keboola.com, "Data Streams Overview",
Template (Jsonnet)): ``Ip()`` the client address, ``Body()`` the body as an object,
``Body(path)`` a field that fails the record when missing, ``Body(path, default)``,
``BodyStr()`` the body as a string, ``Header()`` every header (``Content-Type`` keys),
``Header(name)`` failing when missing, ``Header(name, default)``, ``HeaderStr()`` one
``Name: value`` line per header sorted alphabetically, ``Now()`` in the default format
(``2023-01-14T08:04:05.123Z``) and ``Now(format)`` strftime-style. The real ``jsonnet``
library evaluates each template; values are the compact JSON text Keboola stores."""

from __future__ import annotations

import msgspec
import pytest

from icefloe.streams.templates import (
    MAX_CONTENT,
    TemplateRows,
    body_path,
    check_template,
    evaluate,
)

RECEIVED_MS = 1673683445123
"""2023-01-14T08:04:05.123Z, Keboola's example value of ``Now()``."""
BODY = '{"a":"b","deeply":{"nested":{"path":1000}},"list":[{"x":1},{"x":2}]}'
HEADERS = '{"content-type":"application/json","x-github-event":"issues"}'


def one(template: str, body: str | None = BODY, headers: str | None = HEADERS,
        ip: str | None = "127.0.0.1") -> str:
    """``template``'s value for one event (its JSON text); fails the test if it fails."""
    values, errors = evaluate(template, TemplateRows([body], [ip], [headers], [RECEIVED_MS]))
    assert errors == {}, errors
    assert values[0] is not None
    return values[0]


def failure(template: str, body: str | None = BODY, headers: str | None = HEADERS) -> str:
    values, errors = evaluate(template, TemplateRows([body], ["127.0.0.1"], [headers],
                                                     [RECEIVED_MS]))
    assert values == [None]
    return errors[0]


def test_ip_is_the_client_address() -> None:
    assert one("Ip()") == '"127.0.0.1"'


def test_body_is_the_whole_body_as_an_object() -> None:
    assert msgspec.json.decode(one("Body()")) == msgspec.json.decode(BODY)
    assert one("Body().a") == '"b"'  # an object: its fields are Jsonnet fields


def test_body_path_reads_a_field_in_dot_syntax() -> None:
    assert one('Body("deeply.nested.path")') == "1000"
    assert one("Body('list[1].x')") == "2"
    assert one("Body('deeply.nested')") == '{"path":1000}'


def test_body_path_fails_the_record_when_the_field_is_missing() -> None:
    assert failure('Body("deeply.nested.nope")') == 'path "deeply.nested.nope" not found ' \
        "in the body"
    assert failure("Body('list[5].x')") == 'path "list[5].x" not found in the body'


def test_body_path_with_a_default_takes_it_when_missing() -> None:
    assert one('Body("deeply.nested.nope", 2000)') == "2000"
    assert one('Body("deeply.nested.path", 2000)') == "1000"
    assert one("Body('x', null)") == "null"
    assert one("Body('x', {k: [1]})") == '{"k":[1]}'


def test_body_str_is_the_body_text() -> None:
    assert one("BodyStr()") == msgspec.json.encode(BODY).decode()


def test_header_is_every_header_with_canonical_names() -> None:
    assert msgspec.json.decode(one("Header()")) == {
        "Content-Type": "application/json", "X-Github-Event": "issues"}


def test_header_name_reads_one_header_whatever_its_case() -> None:
    assert one('Header("Content-Type")') == '"application/json"'
    assert one("Header('x-github-event')") == '"issues"'


def test_header_name_fails_the_record_when_missing() -> None:
    assert failure('Header("X-Missing")') == 'header "X-Missing" not found'


def test_header_name_with_a_default_takes_it_when_missing() -> None:
    assert one('Header("X-Missing", "none")') == '"none"'
    assert one('Header("Content-Type", "none")') == '"application/json"'


def test_header_str_is_one_sorted_line_per_header() -> None:
    text = msgspec.json.decode(one("HeaderStr()"))
    assert text.splitlines() == ["Content-Type: application/json", "X-Github-Event: issues"]
    headers = '{"b-header":"2","a-header":"1"}'  # sorted, not in arrival order
    assert msgspec.json.decode(one("HeaderStr()", headers=headers)).splitlines() == [
        "A-Header: 1", "B-Header: 2"]


def test_now_is_the_receive_time_in_keboolas_default_format() -> None:
    assert one("Now()") == '"2023-01-14T08:04:05.123Z"'


def test_now_with_a_format_is_strftime() -> None:
    assert one('Now("%Y-%m-%d")') == '"2023-01-14"'
    assert one("Now('%H:%M:%S')") == '"08:04:05"'


def test_globals_combine_in_one_expression() -> None:
    value = one("{id: Body('deeply.nested.path'), ip: Ip(), day: Now('%Y-%m-%d'), "
                "kind: Header('X-Github-Event')}")
    assert msgspec.json.decode(value) == {"id": 1000, "ip": "127.0.0.1",
                                          "day": "2023-01-14", "kind": "issues"}


def test_one_failing_event_of_a_block_fails_alone() -> None:
    bodies = ['{"n":1}', "{}", '{"n":3}']
    rows = TemplateRows(bodies, [None] * 3, [None] * 3, [RECEIVED_MS] * 3)
    values, errors = evaluate("Body('n') * 10", rows)
    assert values == ["10", None, "30"]
    assert errors == {1: 'path "n" not found in the body'}


def test_a_template_error_names_its_own_line() -> None:
    rows = TemplateRows(['{"n":"x"}'], [None], [None], [RECEIVED_MS])
    values, errors = evaluate("1 +\nerror 'boom ' + Body('n')", rows)
    assert values == [None]
    assert "boom x" in errors[0]


def test_check_refuses_what_can_never_evaluate() -> None:
    check_template("Body('a.b') + Ip()")  # fine, though the check has no body
    for bad, reason in (("Body(", "not a Jsonnet expression"),
                        ("Unknown()", "not a Jsonnet expression"),
                        ("  ", "empty"), ("1" * (MAX_CONTENT + 1), "at most")):
        with pytest.raises(ValueError, match=reason):
            check_template(bad)


def test_body_path_syntax() -> None:
    assert body_path("issue.labels[0].name") == ("issue", "labels", 0, "name")
    for bad in ("a..b", "a.", ".a", ""):
        with pytest.raises(ValueError, match=r"path|offset"):
            body_path(bad)
