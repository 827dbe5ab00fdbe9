"""Secrets out of text: URL passwords, secret query parameters and bearer tokens.

Why one module: the catalog label, the store URL in a start-up line and the logging filter
(:class:`icefloe.logs.RedactingFilter`) must mask the same things the same way. Callers
mask what they know is a URI with :func:`mask_uri` before they log it; :func:`redact` is the
last line of defence for free text (an exception message that quotes a connection string,
a header echoed by a library), so it errs towards masking.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"
SECRET_QUERY_KEYS = ("password", "secret", "token", "credential")
"""Query parameters whose values are masked (matched as substrings, case-insensitive)."""

# scheme://user:password@host: the password is everything up to the last '@' before the
# path, so passwords with '@' or ':' in them are masked whole.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s/]*(?=@)")
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)[^\s\"',;]+")
_ICEFLOE_TOKEN = re.compile(r"\bifl_[A-Za-z0-9_-]{8,}")
"""A token ``icefloe token new`` made, wherever it appears (its prefix is there for this)."""
_SECRET_WORD = r"(?:password|secret|token|credential)"
_SECRET_KEY = rf"[a-z0-9_.-]*{_SECRET_WORD}[a-z0-9_.-]*"
_COMPOUND_KEY = rf"(?:[a-z0-9_.-]*[_.-]{_SECRET_WORD}[a-z0-9_.-]*|{_SECRET_WORD}[_.-][a-z0-9_.-]*)"
# The value after a secret-looking key, the key at the start of the text or after a
# separator: key=value; 'key': 'value' (a dict or JSON echoed in an error); and key: value
# for compound keys (client_secret: x) — a bare "token:" is as likely prose as a key.
_SECRET_PARAM = re.compile(
    r"(?i)(?P<head>(?:^|(?<=[?&;\s,({\[]))"
    rf"(?:[\"']{_SECRET_KEY}[\"']\s*[=:]|{_SECRET_KEY}\s*=|{_COMPOUND_KEY}\s*:)"
    r"\s*[\"']?)[^&\s\"',;)}\]]+")


def _is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_QUERY_KEYS)


def mask_uri(uri: str) -> str:
    """``scheme://user:secret@host/db?password=x`` → ``scheme://user:***@host/db?password=***``.

    Edits the string in place rather than re-assembling it: ``urlunsplit`` would turn
    ``sqlite:////abs.db`` into ``sqlite://abs.db``.
    """
    head, sep, query = uri.partition("?")
    if "://" in head:
        scheme, rest = head.split("://", 1)
        netloc, slash, path = rest.partition("/")
        if "@" in netloc:
            user_info, host = netloc.rsplit("@", 1)
            user, _, password = user_info.partition(":")
            if password:
                netloc = f"{user}:{MASK}@{host}"
        head = f"{scheme}://{netloc}{slash}{path}"
    pairs = (p.partition("=") for p in query.split("&")) if query else ()
    query = "&".join(f"{k}{eq}{MASK}" if eq and _is_secret(k) else f"{k}{eq}{v}"
                     for k, eq, v in pairs)
    return f"{head}{sep}{query}"


def redact(text: str) -> str:
    """Mask URL passwords, ``Bearer <token>``, icefloe tokens (``ifl_...``) and the values of
    secret-looking keys (``password=x``, ``secret: x``, ``'token': 'x'``).

    Cheap when there is nothing to mask (a few regex scans over the text), so it can run on
    every log line.
    """
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _BEARER.sub(lambda m: m.group("head") + MASK, text)
    if "ifl_" in text:
        text = _ICEFLOE_TOKEN.sub("ifl_" + MASK, text)
    if "=" in text or ":" in text:
        text = _SECRET_PARAM.sub(lambda m: m.group("head") + MASK, text)
    return text


MAX_DEPTH = 16
"""Nesting redacted into; anything deeper is masked whole (and cycles end there)."""
_PLAIN = (int, float, bool, type(None))


def redact_value(value: object, depth: int = 0) -> object:
    """A structured value (a log record's extra field) with its secrets masked.

    Why beyond strings: a formatter renders dicts, lists, tuples and bytes too (JSON, or
    ``str()``), so a token inside ``extra={"headers": {...}}`` or a bytes body would reach
    the line unmasked. Strings go through :func:`redact`; bytes are decoded (invalid UTF-8
    escaped) and redacted as text; mappings and sequences are rebuilt with their items
    redacted, the value of a secret-looking key (``password``, ``token``, ...) masked whole;
    numbers, booleans and None pass; any other object is redacted as its ``str()``.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, _PLAIN):
        return value
    if depth >= MAX_DEPTH:
        return MASK
    if isinstance(value, bytes | bytearray | memoryview):
        return redact(bytes(value).decode("utf-8", "backslashreplace"))
    if isinstance(value, Mapping):
        return {redact_value(key, depth + 1): _masked_item(key, item, depth + 1)
                for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(redact_value(item, depth + 1) for item in value)
    if isinstance(value, list | set | frozenset):
        return [redact_value(item, depth + 1) for item in value]
    return redact(str(value))


def redact_field(key: str, value: object) -> object:
    """A named value (a log record's extra field) redacted as it would be in a mapping."""
    return _masked_item(key, value, 0)


def _masked_item(key: object, item: object, depth: int) -> object:
    """The value under ``key``: masked whole when the key looks secret and the value is a
    scalar (a container under it is redacted item by item)."""
    if isinstance(key, str) and _is_secret(key) and not isinstance(
            item, Mapping | list | tuple | set | frozenset | bool | type(None)):
        return MASK
    return redact_value(item, depth)
