"""Structured logging: one JSON object per line (or plain text for a terminal).

Why JSON lines: operators ship logs to a collector and filter by field (``stream``,
``sequence``, ``producer``); a line per event with stable keys makes that possible without
parsing prose. Extra fields passed as ``log.info(..., extra={"stream": s})`` become keys.

Every line passes :class:`RedactingFilter` on its way out: callers mask what they know is
secret (``mask_uri`` on a catalog URI), and the filter is the last line of defence for what
they did not foresee — a library's exception that quotes a connection string, a header
echoed back. It masks ``user:password@`` in URLs, ``Bearer <token>`` and secret-looking
``key=value`` pairs in the message, the extra fields and the traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from icefloe.redact import redact, redact_field

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **extra}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_text:
            entry["exc"] = record.exc_text
        elif record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class RedactingFilter(logging.Filter):
    """Masks secrets in a record before any formatter sees it (see the module docstring).

    Attach it to handlers (a logger's filters do not run for records of its children).
    It rewrites the record in place: the message is rendered once and masked, extra fields
    are masked however they nest (strings, bytes, dicts, lists, tuples; an extra named like
    a secret is masked whole), and a traceback is rendered into ``exc_text`` and masked.
    """

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as usual
            return True
        record.msg, record.args = redact(message), None
        for key, value in vars(record).items():
            if key not in _STANDARD:
                setattr(record, key, redact_field(key, value))
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger once for a long-running process."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "botocore", "aiobotocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
