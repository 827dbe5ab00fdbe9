"""The scale benchmark's model (issue #25): its counts add up and its S3 model behaves.

Why here: ``bench/scale_bench.py`` reports throughput and cost figures read off a modeled
cluster; a model that silently dropped or double-counted entries would make every figure
meaningless. These tests run the model for about a second with the real producer,
publishing, consumer and GC code, and check exactly-once and the JSON shape; the S3
model's rate limit and request accounting are checked on their own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from icefloe.clock import ManualClock
from icefloe.errors import TransientStoreError
from testing.s3model import PrefixThrottle, S3Model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "bench" /
                                                  "scale_bench.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_bench"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def test_model_run_acks_exactly_what_the_collector_drains(bench: ModuleType,
                                                          tmp_path: Path) -> None:
    # fault rates well above the bench's, so lost answers and races do happen
    spec = bench.ClusterSpec(4, batch_bytes=100_000, duration_s=1.2, warmup_s=0.3,
                             lost_answer=0.05, lost_race=0.05, seed=7)
    run = asyncio.run(bench.run_cluster(spec))

    assert run.faults > 0  # the ambiguous paths were exercised
    assert run.offered == pytest.approx(4 * 1.2 / bench.FLUSH_S, abs=4)
    assert run.acked_total > 0
    assert run.acked_in_window > 0
    assert run.lost == 0
    assert run.duplicates == 0
    # every acked batch drained once; only failed publishes may add (at most once each)
    assert run.acked_total <= run.drained_total <= run.acked_total + run.failed
    assert run.acked_bytes_total == run.acked_total * spec.batch_bytes
    assert run.gc_deleted >= run.drained_total  # everything drained was collected
    assert run.requests[("ingestor", "put", "batch")] >= run.acked_total
    assert run.requests[("collector", "get", "batch")] >= run.drained_total
    assert len(run.latencies) == run.offered

    results = bench.cluster_results(run) + bench.cost_results([run])
    out = tmp_path / "scale.json"
    bench.write_json(str(out), results)
    doc = json.loads(out.read_text())
    assert {"cores", "python"} <= set(doc["hardware"])
    assert doc["results"]
    for row in doc["results"]:
        assert set(row) == {"name", "value", "unit", "baseline", "ratio"}
        assert isinstance(row["value"], int | float)
    by_name = {row["name"]: row for row in doc["results"]}
    entries = by_name["4 ingestors, 100 KB batches, 1 shard: entries/s (baseline: offered)"]
    assert entries["baseline"] == pytest.approx(run.offered / spec.duration_s)
    assert entries["value"] == pytest.approx(run.acked_in_window / spec.duration_s)


def test_the_exactly_once_check_sees_a_lost_and_a_duplicated_entry(bench: ModuleType
                                                                  ) -> None:
    tally = bench._Tally((0.0, 1.0), b"x", 0)
    tally.acked = [1, 2, 3]
    tally.drained = [(1, "p", 1), (3, "p", 3), (3, "p", 3)]
    run = bench.ClusterRun(bench.ClusterSpec(1), 1.0, drained_total=3)
    bench._check_exactly_once(run, tally)
    assert run.lost == 1
    assert run.duplicates == 2


def test_model_run_on_shards_drains_every_shard_exactly_once(bench: ModuleType) -> None:
    """Four ingestors on two shards, read by the real ShardedConsumer: both shards carry
    entries, and every acked batch is drained exactly once (positions per shard)."""
    spec = bench.ClusterSpec(4, batch_bytes=50_000, shards=2, duration_s=1.0, warmup_s=0.3,
                             lost_answer=0.05, lost_race=0.05, seed=3)
    run = asyncio.run(bench.run_cluster(spec))
    assert run.acked_total > 0
    assert run.lost == 0
    assert run.duplicates == 0
    assert run.acked_total <= run.drained_total <= run.acked_total + run.failed
    assert run.gc_deleted >= run.drained_total
    assert run.shards_drained == 2



def test_prefix_throttle_answers_slowdown_beyond_the_documented_rate() -> None:
    clock = ManualClock()
    throttle = PrefixThrottle(clock=clock)
    admitted = sum(throttle.admit("put", f"batches/{i}") for i in range(4000))
    assert admitted == 3500  # one second's worth of PUTs per prefix
    assert throttle.admit("put", "other/x")  # another prefix has its own bucket
    assert sum(throttle.admit("get", f"batches/{i}") for i in range(6000)) == 5500
    clock.advance(0.1)
    refilled = sum(throttle.admit("put", f"batches/{i}") for i in range(1000))
    assert refilled == pytest.approx(350, abs=1)  # refilled at 3,500 per second


def test_metered_view_counts_requests_and_raises_slowdown() -> None:
    async def scenario() -> tuple[S3Model, str]:
        model = S3Model(latency_s=(0.0, 0.0), writes_per_s=2.0)
        view = model.view("a")
        await view.put("batches/1.ifb", b"x" * 10)
        await view.put("batches/2.ifb", b"y" * 10)
        try:
            await view.put("batches/3.ifb", b"z")
        except TransientStoreError as exc:
            code = exc.code or ""
        await model.view("gc", "collector").list("batches/")
        return model, code

    model, code = asyncio.run(scenario())
    assert code == "SlowDown"
    assert model.log.requests[("ingestor", "put", "batch")] == 3  # throttled ones count
    assert model.log.requests[("collector", "list", "batch")] == 1
    assert set(model.bucket.objects) == {"batches/1.ifb", "batches/2.ifb"}


def test_process_rows_carry_the_moto_caveat_and_requests_per_entry(bench: ModuleType) -> None:
    """The real-processes rows say moto serves one request at a time, next to the figures."""
    from collections import Counter

    import _scale_processes as sp

    run = sp.ProcessRun(sp.ProcessSpec(8, shards=4), window_s=10.0, entries=200.0,
                        events=40_000.0, cas_writes=150.0, conflicts=30.0,
                        store_requests=Counter({"PUT": 500, "GET": 300}),
                        accepted_total=50_000.0, committed_total=50_000.0)
    rows = {r.name: r for r in bench.process_results(run)}
    assert all("moto serves one request at a time" in name for name in rows)
    by_tail = {name.split(": ", 1)[1]: r for name, r in rows.items()}
    assert by_tail["entries/s"].value == 20.0
    assert by_tail["PUTs per entry appended (all clients)"].value == 2.5
    assert by_tail["GETs per entry appended (all clients)"].value == 1.5
    assert by_tail["accepted - committed after the drain"].value == 0.0


def test_delay_rule_in_front_of_moto_logs_every_request_by_method(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real-processes rows count the store's requests from the delay rule's log."""
    import _scale_processes as sp
    import boto3

    from testing.chaos.moto_server import FAKE_CREDENTIALS

    # start_moto writes these into the environment: restored after the test
    for name, value in {**FAKE_CREDENTIALS, "AWS_CONFIG_FILE": "",
                        "AWS_SHARED_CREDENTIALS_FILE": ""}.items():
        monkeypatch.setenv(name, value)
    faults = tmp_path / "faults.json"
    sp.write_faults(faults, seed=1)
    moto = sp.start_moto(str(faults))
    try:
        url = moto.bucket_url("scale")
        client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
        bucket = url.removeprefix("s3://").split("/", 1)[0]
        client.put_object(Bucket=bucket, Key="a", Body=b"x")
        client.get_object(Bucket=bucket, Key="a")
        client.close()
    finally:
        moto.stop()

    class _Cluster:
        faults_file = faults

    counted = sp._requests(_Cluster())  # type: ignore[arg-type]
    assert counted["GET"] == 1
    assert counted["PUT"] == 2  # the bucket's creation, then the object


def test_trace_splits_every_ack_into_stages_that_add_up(bench: ModuleType) -> None:
    """``--trace``: each ack's stages (slot, batch PUT, behind the CAS in flight, own
    CAS) sum to its total, and the collector's runs are recorded."""
    from _scale_trace import Trace, split, summarize

    spec = bench.ClusterSpec(4, batch_bytes=50_000, shards=2, duration_s=1.0,
                             warmup_s=0.3, seed=3)
    trace = Trace()
    run = asyncio.run(bench.run_cluster(spec, trace))
    splits = [split(f, trace.stores[f.ingestor].requests) for f in trace.flushes]
    done = [s for s in splits if s is not None]
    assert len(done) == run.acked_total
    for s in done:
        assert s.total == pytest.approx(s.slot + s.put + s.behind + s.cas)
        assert s.cas_puts >= 1  # every ack needed at least its own manifest write
    assert trace.runs
    assert sum(r[5] for r in trace.runs) == run.drained_total
    lines = summarize(trace, trace.window)
    assert any("slowest 1 %" in line for line in lines)


def test_trend_tells_a_saw_tooth_from_a_growing_queue(bench: ModuleType) -> None:
    """The collector rows' target: a bounded saw-tooth queue (fills between runs, empties at
    each commit) has a slope within its margin of 0; one that also grows by 2 entries/s
    does not, though the growth is small beside the saw-tooth."""
    import random

    from _scale_collector import trend

    rng = random.Random(7)
    def queue(growth: float) -> list[tuple[float, float]]:
        return [(t / 10, 2000 + 1500 * ((t / 10) % 1.7) / 1.7 + growth * t / 10
                 + rng.gauss(0, 100)) for t in range(3000)]
    flat_slope, flat_margin = trend(queue(0.0), 60.0)
    assert flat_slope - flat_margin <= 0 <= flat_slope + flat_margin
    assert flat_margin < 2
    grow_slope, grow_margin = trend(queue(2.0), 60.0)
    assert grow_slope - grow_margin > 0
    assert trend([(0.0, 1.0)], 0.0) == (0.0, 0.0)
