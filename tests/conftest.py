"""Shared fixtures: a real S3 server (moto) on localhost, and fresh buckets on it.

Why a real HTTP server and not ``mock_aws``: the S3 stores must be tested through botocore's
and aiohttp's real network paths (signing, headers, error parsing, connection handling), and
child processes spawned by tests must be able to reach the same server by URL.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""Fake credentials for the whole session, so no test can reach (or bill) a real account."""

# Anything that would point botocore at real credentials or another endpoint is removed.
_SCRUBBED_AWS_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
                     "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@dataclass(frozen=True)
class S3Target:
    """An empty S3 location on the moto server: pass ``url`` and ``endpoint_url`` to a store."""

    url: str
    endpoint_url: str
    bucket: str
    prefix: str


class _SerializedApp:
    """A WSGI app that handles one request at a time.

    moto checks ``If-Match``/``If-None-Match`` and then writes in separate steps, so two
    concurrent conditional PUTs could both win. Real S3 makes the check-and-write atomic;
    holding a lock around the whole request (including consuming the response body) gives
    the test server the same guarantee.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> list[bytes]:
        with self._lock:
            result = self._app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


@pytest.fixture(scope="session")
def aws_test_env() -> Iterator[None]:
    """Fake AWS credentials in ``os.environ`` for the session (restored afterwards).

    Child processes inherit them, so spawned workers reach moto with the same identity.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_AWS_ENV.items():
            patch.setenv(name, value)
        for name in _SCRUBBED_AWS_ENV:
            patch.delenv(name, raising=False)
        # Never read the developer's ~/.aws files during tests.
        patch.setenv("AWS_CONFIG_FILE", os.devnull)
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        yield


@pytest.fixture(scope="session")
def moto_server(aws_test_env: None) -> Iterator[str]:
    """Start a moto S3 server on a free localhost port; yield its endpoint URL."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = _SerializedApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def s3_bucket(moto_server: str) -> S3Target:
    """A fresh, uniquely named bucket on the moto server, as ``s3://bucket/prefix/``."""
    import boto3

    bucket = f"icefloe-test-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    prefix = "data/"
    return S3Target(url=f"s3://{bucket}/{prefix}", endpoint_url=moto_server, bucket=bucket,
                    prefix=prefix)


@pytest.fixture(scope="session")
def spark() -> Any:
    """The one SparkSession of the test session (JVM start costs ~10 s; pay it once)."""
    from pipeline.spark import get_spark

    session = get_spark("local[2]", "icefloe-tests", {"spark.driver.memory": "1g"})
    yield session
    session.stop()
