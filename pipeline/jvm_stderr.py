"""The JVM's stderr as JSON lines, in a process that logs JSON lines.

Why: log4j's lines are already JSON (``log4j2-json.properties``), but the JVM itself writes
a few lines no logging framework sees (``WARNING: Using incubator modules: ...`` at every
start, a crash notice), and so do Python workers forked by it. One plain line in a JSON log
breaks a shipper that parses every line. So while the JVM starts, fd 2 is a pipe: the child
inherits it, and a thread copies each line to the real stderr — as is when it is a JSON
object, else wrapped as ``{"ts", "level": "warning", "logger": "spark.stderr", "msg"}``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator

from icefloe.logs import JsonFormatter, RedactingFilter

LOGGER = "spark.stderr"
DRAIN_AT_EXIT_S = 1.0
"""At exit, how long to wait for a relay to copy the last lines of a child that ended."""
_relays: list[threading.Thread] = []


@atexit.register
def _drain() -> None:
    """Let each relay copy what its (ended) child wrote last: a daemon thread would
    otherwise die with the interpreter, lines unread. Registered at import, so it runs
    after pyspark's own exit hook has stopped the JVM."""
    for relay in _relays:
        relay.join(DRAIN_AT_EXIT_S)


def json_line(line: str) -> str:
    """``line`` as one JSON log line: a JSON object unchanged, anything else wrapped."""
    text = line.rstrip("\r\n")
    with contextlib.suppress(ValueError):
        if isinstance(json.loads(text), dict):
            return text
    record = logging.LogRecord(LOGGER, logging.WARNING, "", 0, text, None, None)
    RedactingFilter().filter(record)
    return JsonFormatter().format(record)


def _relay(read_fd: int, out_fd: int) -> None:
    with os.fdopen(read_fd, "r", errors="replace") as lines, \
            os.fdopen(out_fd, "w") as out:
        for line in lines:
            out.write(json_line(line) + "\n")
            out.flush()


@contextlib.contextmanager
def stderr_as_json(enabled: bool) -> Iterator[None]:
    """While this block starts a child (the JVM), give it a stderr that becomes JSON lines;
    this process's own stderr is restored on leaving. No-op unless ``enabled``."""
    if not enabled:
        yield
        return

    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    relay = threading.Thread(target=_relay, args=(read_fd, os.dup(saved)), daemon=True,
                             name="jvm-stderr")
    relay.start()
    _relays.append(relay)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
