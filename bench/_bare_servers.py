"""Bare servers for the ingest benchmark's ceilings: same stacks, no icefloe work.

``python bench/_bare_servers.py http PORT`` — raw ASGI on uvicorn (uvloop + httptools) that
reads the body and answers 202 (the issue's "endpoint that does nothing");
``... grpc PORT`` — grpc.aio Ingest service that parses each event's JSON (untyped msgspec)
into a list and answers ``accepted = len(events)``, as the CEILINGS.md gRPC probe did.
"""

from __future__ import annotations

import sys
from typing import Any

RESPONSE = b'{"accepted":1}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"14")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 202, "headers": HEADERS})
    await send({"type": "http.response.body", "body": RESPONSE})


def run_http(port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                lifespan="off", access_log=False, log_level="warning")


def run_grpc(port: int) -> None:
    import grpc
    import msgspec
    import uvloop

    from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

    decode = msgspec.json.decode
    kept: list[Any] = []

    def parse(request: Any) -> Any:
        kept.extend(decode(event.json) for event in request.events)
        if len(kept) > 200_000:
            kept.clear()
        return ingest_pb2.PublishResponse(accepted=len(request.events),
                                          request_id=request.request_id)

    class Bare(ingest_pb2_grpc.IngestServicer):
        async def Publish(self, request: Any, context: Any) -> Any:
            return parse(request)

        async def PublishStream(self, requests: Any, context: Any) -> Any:
            async for request in requests:
                yield parse(request)

    async def serve() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        ingest_pb2_grpc.add_IngestServicer_to_server(Bare(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.run(serve())


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    run_http(port) if kind == "http" else run_grpc(port)
