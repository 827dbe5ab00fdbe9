"""Load for a chaos run: client processes that record exactly what was acknowledged.

Why separate processes: the clients must keep sending (and keep their ledger) while the
harness kills ingestors, and must not share a GIL with the harness's own bookkeeping. Each
client owns an id prefix, so every event id in the run is unique and attributable.

A request is sent with an idempotency key and its events carry ids (the stream's
``event_id_field``); when an attempt fails in a retryable way (429, 503, a reset, a refused
connection because its ingestor was just killed), the client resends the *same* events with
the *same* key to the next ingestor — the safe retry the README promises. Each request ends
as one ledger line: acknowledged, or given up (then its events may or may not be stored:
at most once is all that can be promised).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from icefloe.client import GrpcClient, HttpClient, IngestRejected

ATTEMPTS = 8
HANG_S = 20.0
"""A request that takes longer than this counts as a hang: backpressure must answer, not
stall (the ingestor's own deadlines are shorter)."""


@dataclass(frozen=True)
class ClientSpec:
    index: int
    transport: str  # "http" | "grpc" | "kafka" (testing.chaos.kafka_load)
    endpoints: tuple[str, ...]
    ledger: str
    stop_file: str
    seed: int
    rate: float  # requests per second (0: as fast as acknowledgements come)


@dataclass
class Request:
    prefix: str
    first: int
    count: int
    key: str


def _events(req: Request, client: int) -> list[dict[str, object]]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return [{"id": f"{req.prefix}{req.first + i}", "client": f"c{client}",
             "n": req.first + i, "sent_at": now} for i in range(req.count)]


def run_client(spec: ClientSpec) -> None:
    """Send until the stop file appears; one JSON line per request in the ledger."""
    rng = random.Random(spec.seed)
    prefix = f"c{spec.index}-"
    stream = "chaos_http" if spec.transport == "http" else "chaos_grpc"
    statuses: Counter[str] = Counter()
    clients = [HttpClient(url, retries=0, timeout=HANG_S) if spec.transport == "http"
               else GrpcClient(url, retries=0, timeout=HANG_S) for url in spec.endpoints]
    stop = Path(spec.stop_file)
    n = 0
    with open(spec.ledger, "a") as ledger:
        for number in range(10**9):
            if stop.exists():
                break
            size = rng.choice((1, 1, 5, 20, 100))
            req = Request(prefix, n, size, f"{prefix}r{number}")
            n += size
            outcome = _send(req, _events(req, spec.index), clients, stream, rng, statuses)
            ledger.write(json.dumps({**asdict(req), **outcome}) + "\n")
            ledger.flush()
            if spec.rate:
                time.sleep(rng.expovariate(spec.rate))
        ledger.write(json.dumps({"statuses": dict(statuses)}) + "\n")
    for client in clients:
        client.close()


def _send(req: Request, events: list[dict[str, object]], clients: list[HttpClient | GrpcClient],
          stream: str, rng: random.Random, statuses: Counter[str]) -> dict[str, object]:
    start = rng.randrange(len(clients))
    hangs = 0
    for attempt in range(ATTEMPTS):
        client = clients[(start + attempt) % len(clients)]
        began = time.monotonic()
        try:
            if isinstance(client, HttpClient):
                accepted = client.send(stream, events, idempotency_key=req.key)
            else:
                accepted = client.publish(stream, events, request_id=req.key)
        except IngestRejected as exc:
            code = exc.status.name if isinstance(exc.status, grpc.StatusCode) \
                else str(exc.status or exc.code)
            statuses[code] += 1
            if time.monotonic() - began >= HANG_S * 0.95:
                hangs += 1
            if not exc.retryable:
                return {"acked": False, "error": f"{code} {exc.message[:200]}",
                        "hangs": hangs, "at": time.time()}
            time.sleep(min(2.0, (exc.retry_after_s or 0.1) * rng.uniform(0.5, 1.5)))
            continue
        statuses["ok"] += 1
        if accepted != req.count:
            return {"acked": False, "error": f"accepted {accepted} of {req.count}",
                    "hangs": hangs, "at": time.time()}
        return {"acked": True, "hangs": hangs, "at": time.time()}
    return {"acked": False, "error": "gave up", "hangs": hangs, "at": time.time()}


def read_ledgers(paths: list[Path]) -> tuple[set[str], set[str], Counter[str], int, list[str]]:
    """Acknowledged ids, attempted-but-unacknowledged ids, statuses, hangs and errors."""
    acked: set[str] = set()
    unacked: set[str] = set()
    statuses: Counter[str] = Counter()
    hangs = 0
    errors: list[str] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "statuses" in row:
                statuses.update(row["statuses"])
                continue
            ids = {f"{row['prefix']}{row['first'] + i}" for i in range(row["count"])}
            (acked if row["acked"] else unacked).update(ids)
            hangs += row.get("hangs", 0)
            if not row["acked"] and row.get("error") not in (None, "gave up"):
                errors.append(row["error"])
    return acked, unacked, statuses, hangs, errors
