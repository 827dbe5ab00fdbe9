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
from collections.abc import Callable, Iterator
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


@dataclass
class S3Fault:
    """Answer ``times`` requests of ``method`` whose path contains ``path_part`` with an
    S3 error (``status``, ``code``) instead of serving them."""

    method: str
    path_part: str
    status: int
    code: str
    times: int
    fired: int = 0


class S3Faults:
    """Faults the moto server injects — the object-store boundary, over real HTTP, so that
    every process (Spark workers included) sees them."""

    def __init__(self) -> None:
        self.rules: list[S3Fault] = []
        self._lock = threading.Lock()

    def add(self, method: str, path_part: str, status: int = 503, code: str = "SlowDown",
            times: int = 1) -> S3Fault:
        rule = S3Fault(method, path_part, status, code, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def match(self, method: str, path: str) -> S3Fault | None:
        with self._lock:
            for rule in self.rules:
                if rule.fired < rule.times and rule.method == method \
                        and rule.path_part in path:
                    rule.fired += 1
                    return rule
        return None


S3_FAULTS = S3Faults()


def _inject_fault(environ: dict[str, Any], start_response: Callable[..., Any]
                  ) -> list[bytes] | None:
    """Answer a request with the S3 error of a matching :class:`S3Fault`, if any."""
    fault = S3_FAULTS.match(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
    if fault is None:
        return None
    body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{fault.code}</Code>"
            f"<Message>injected by the test</Message></Error>").encode()
    start_response(f"{fault.status} {fault.code}", [
        ("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Put the root logger back after each test.

    Why: a test that runs a CLI command in-process (``main([...])``) configures logging
    with a handler on that test's captured stderr; once the capture closes, any later log
    line from a background thread (a server in another test) fails with "I/O operation on
    closed file" and prints a logging error into whatever stderr is current.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


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
    from testing.chaos.moto_server import MotoServer

    server = MotoServer(intercept=_inject_fault)
    try:
        yield server.endpoint
    finally:
        server.stop()


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


@pytest.fixture
def s3_faults() -> Iterator[S3Faults]:
    """The moto server's fault plan, emptied after the test."""
    S3_FAULTS.clear()
    yield S3_FAULTS
    S3_FAULTS.clear()


@pytest.fixture(scope="session")
def spark(aws_test_env: None) -> Any:
    """The one SparkSession of the test session (JVM start costs ~10 s; pay it once).

    It depends on the fake AWS environment so that Spark's Python workers, which inherit
    the JVM's environment, reach the moto server with the same identity as the tests.
    """
    from pipeline.spark import get_spark

    session = get_spark("local[2]", "icefloe-tests", {"spark.driver.memory": "1g"})
    yield session
    session.stop()
