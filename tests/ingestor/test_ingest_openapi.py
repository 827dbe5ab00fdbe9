"""The ingest HTTP API's ``/openapi.json``, checked by schemathesis against a real ingestor.

The ingestor runs as ``icefloe ingestor`` serves it (uvicorn with the guarded protocol and
the fast lane, a real runtime on a local store) on its own thread and event loop, because
schemathesis calls it synchronously. Every documented operation gets generated requests;
none may get a 5xx, a status the document does not list, or a body that does not match.
Half of the cases name a configured stream, so validation and durable 202s are exercised
too, not only 404s for the fuzzer's random stream names.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from icefloe.config import Column, StreamConfig
from tests.ingest_support import ORDERS, PAGEVIEWS, http_serving, make_config, running

OPEN = StreamConfig(name="anything", table="fuzz.anything",
                    columns=(Column("note", "string"),))
"""No tokens, no required column, unknown fields ignored: most objects the fuzzer makes
are valid events, so it gets durable 202s as well as refusals."""
OPEN_STREAM = OPEN.name


@pytest.fixture(scope="module")
def ingestor_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store_dir: Path = tmp_path_factory.mktemp("openapi-store")
    config = make_config(store_dir, (PAGEVIEWS, ORDERS, OPEN))
    ready: queue.Queue[str | BaseException] = queue.Queue()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        holder["loop"], holder["stop"] = asyncio.get_running_loop(), stop
        async with running(config) as runtime, http_serving(runtime) as url:
            ready.put(url)
            await stop.wait()

    def thread_main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # handed to the test thread
            ready.put(exc)

    thread = threading.Thread(target=thread_main, name="ingestor", daemon=True)
    thread.start()
    started = ready.get(timeout=60)
    if isinstance(started, BaseException):
        raise started
    try:
        yield started
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(timeout=60)


def test_should_serve_a_valid_openapi_document(ingestor_url: str) -> None:
    from openapi_spec_validator import validate

    from icefloe import __version__
    from ingestor.http.steps import ingest_target

    response = httpx.get(f"{ingestor_url}/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    validate(document)
    assert document["info"]["version"] == __version__
    for path in document["paths"]:
        concrete = path.replace("{stream}", "s").replace("{schema}", "a").replace(
            "{table}", "b")
        if "post" in document["paths"][path]:
            assert ingest_target(concrete) is not None, f"{path} is not an ingest route"
        else:
            assert httpx.get(f"{ingestor_url}{concrete}").status_code == 200, path


def test_should_accept_what_the_document_describes(ingestor_url: str) -> None:
    response = httpx.post(f"{ingestor_url}/v1/streams/{OPEN_STREAM}/events",
                          json=[{"user_id": "u1", "url": "/a"}])
    assert response.status_code == 202, response.text
    assert response.json() == {"accepted": 1}


@pytest.mark.parametrize("route", [f"/v1/streams/{OPEN_STREAM}/events",
                                   f"/collect/{OPEN.table.replace('.', '/')}/batch"])
def test_should_refuse_an_empty_array_as_an_empty_body(ingestor_url: str, route: str) -> None:
    """Found by schemathesis: ``[]`` reached the buffer with no events and got a 500."""
    response = httpx.post(f"{ingestor_url}{route}", content=b"[]",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "empty_body"


def fuzz(op: Any, base_url: str, real_stream: bool, statuses: set[int]) -> None:
    """Generated requests for one operation; raises on the first nonconforming answer."""
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        response_schema_conformance,
        status_code_conformance,
    )

    @settings(max_examples=12, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), database=None)
    @given(case=op.as_strategy())
    def check(case: Any) -> None:
        if real_stream and case.path_parameters:
            if "stream" in case.path_parameters:
                case.path_parameters["stream"] = OPEN_STREAM
            else:  # the seed-compatible routes name the stream's table
                case.path_parameters.update(zip(("schema", "table"),
                                                OPEN.table.split("."), strict=True))
        response = case.call(base_url=base_url)
        statuses.add(response.status_code)
        case.validate_response(response, checks=(not_a_server_error, status_code_conformance,
                                                 response_schema_conformance))

    check()


def test_should_conform_to_its_openapi_document(ingestor_url: str) -> None:
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{ingestor_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    assert {"POST /v1/streams/{stream}/events", "POST /collect/{schema}/{table}/batch",
            "OPTIONS /ingest/{stream}", "GET /readyz"} <= labels, labels
    failures: list[str] = []
    statuses: set[int] = set()
    for op in operations:
        for real_stream in (False, True):
            try:
                fuzz(op, ingestor_url, real_stream, statuses)
            except Exception as exc:  # collected, reported together
                failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:600]}")
    assert not failures, "\n".join(failures)
    assert {200, 202, 204, 400, 404} <= statuses, statuses
