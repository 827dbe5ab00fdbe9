"""A moto S3 server on a free localhost port, with atomic conditional writes.

Why a wrapper: moto checks ``If-Match``/``If-None-Match`` and then writes in separate
steps, so two concurrent conditional PUTs could both win. Real S3 makes check-and-write
atomic; serving one request at a time (the whole request, including consuming the response
body) gives this test server the same guarantee. ``intercept`` may answer a request itself
(fault injection over real HTTP); it sees every request before the lock.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

Intercept = Callable[[dict[str, Any], Callable[..., Any]], "list[bytes] | None"]
DropAfter = Callable[[dict[str, Any]], bool]
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}


class SerializedApp:
    """A WSGI app that handles one request at a time (see the module docstring)."""

    def __init__(self, app: Callable[..., Iterable[bytes]],
                 intercept: Intercept | None = None, drop_after: DropAfter | None = None
                 ) -> None:
        self._app = app
        self._intercept = intercept
        self._drop_after = drop_after
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> list[bytes]:
        if self._intercept is not None:
            answered = self._intercept(environ, start_response)
            if answered is not None:
                return answered
        with self._lock:
            result = self._app(environ, start_response)
            try:
                body = list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        if self._drop_after is not None and self._drop_after(environ):
            drop_connection(environ)  # applied, but the client never hears so
        return body


def drop_connection(environ: dict[str, Any]) -> None:
    """End the client's connection without an answer (what a dead proxy or a network cut
    looks like): shut the socket down and tell the server the connection is gone."""
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)
    raise ConnectionResetError("dropped by the chaos fault layer")


class MotoServer:
    """A running server: ``endpoint`` to connect to, ``stop()`` when done."""

    def __init__(self, intercept: Intercept | None = None,
                 drop_after: DropAfter | None = None, *, port: int = 0) -> None:
        """``port`` 0: a free one; a fixed port lets a test start the store after a client
        was pointed at it (moto's state is per process: every server here serves the same
        buckets)."""
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app = SerializedApp(DomainDispatcherApplication(create_backend_app), intercept,
                            drop_after)
        self._server = make_server("127.0.0.1", port, app, threaded=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="moto-s3")
        self._thread.start()

    def bucket_url(self, bucket: str, prefix: str = "data/") -> str:
        """Create ``bucket`` and return ``s3://bucket/prefix``."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        try:
            client.create_bucket(Bucket=bucket)
        finally:
            client.close()
        return f"s3://{bucket}/{prefix}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
