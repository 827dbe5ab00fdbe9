"""The chaos harness: a short seeded run in the fast suite, a longer one on S3 marked slow,
and the harness's own parts (schedule, fault file, verdict) on their own.

The verdict tests matter as much as the run: a checker that cannot fail proves nothing, so
each check is shown to catch a lost, a duplicated and a never-sent event.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from icefloe.config import load_config
from icefloe.errors import TransientStoreError
from icefloe.store import open_async_store
from icefloe.store.failpoints import FAULTS_ENV, FileDrivenFaultyStore
from testing.chaos.__main__ import parse_duration
from testing.chaos.report import render
from testing.chaos.run import Options, Run, schedule
from testing.chaos.verify import TableRows, freshness, verify


def _assert_exercised(result: dict) -> None:
    """The run really did what it claims: kills, fencing, store faults, real load."""
    assert result["ok"], render(result)
    assert result["kills"].get("ingestor", 0) >= 2
    assert result["kills"].get("collector", 0) >= 1
    assert result["process_exits"].get("collector exit 3", 0) >= 1  # a fenced collector
    assert sum(result["faults_injected"].values()) > 0
    statuses = result["client_statuses"]
    pushed_back = sum(statuses.get(code, 0) for code in
                      ("429", "503", "RESOURCE_EXHAUSTED", "UNAVAILABLE"))
    assert pushed_back > 0  # backpressure answered ...
    assert result["hangs"] == 0  # ... and nothing hung
    assert result["events"]["acked"] > 500
    assert result["events"]["committed_rows"] == result["events"]["acked"] + \
        result["events"]["unacked_but_stored"]


@pytest.mark.timeout(900)
def test_should_lose_and_duplicate_nothing_under_kills_takeovers_and_store_faults(tmp_path):
    result = Run(Options(duration_s=60, seed=11, workdir=str(tmp_path / "run"),
                         keep=True)).execute()
    print(render(result))
    _assert_exercised(result)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_should_hold_on_s3_for_a_longer_run(tmp_path):
    result = Run(Options(duration_s=150, seed=12, store="s3", ingestors=3,
                         workdir=str(tmp_path / "run"), keep=True)).execute()
    print(render(result))
    _assert_exercised(result)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_should_hold_with_a_warm_standby_that_takes_over_within_lease_plus_5s(tmp_path):
    """Issues #28 and #43: the warm standby (the default) takes over from a killed active
    collector; a --takeover fences the active one while the standby keeps waiting."""
    result = Run(Options(duration_s=60, seed=11, workdir=str(tmp_path / "run"),
                         keep=True)).execute()
    print(render(result))
    assert result["ok"], render(result)
    assert result["kills"].get("collector", 0) >= 1
    assert result["process_exits"].get("collector exit 3", 0) >= 1  # the --takeover
    changes = result["collector_changes"]
    assert {c["kind"] for c in changes} == {"kill", "takeover"}, changes
    assert all(c["to_first_commit_s"] is not None for c in changes), changes
    takeovers = list(zip(result["standby_takeover_s"],
                         result["standby_takeover_store_faults"], strict=True))
    assert len(takeovers) >= 1
    # the target holds for a takeover the store does not slow down (a stalled store delays
    # the epoch-bump write itself: those are reported, not held to it)
    lease_s = load_config(tmp_path / "run" / "icefloe.toml", env={}).manifest.lease_s
    clean = [seconds for seconds, store_faults in takeovers if not store_faults]
    assert max(clean, default=0.0) <= lease_s + 5, takeovers


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_should_hold_with_idempotent_kafka_producers_beside_http_and_grpc(tmp_path):
    """Issue #40: librdkafka producers (``enable.idempotence``) on the ingestors' Kafka
    listeners go through the same kills, takeovers and store faults as HTTP and gRPC; their
    retries carry the same producer id, epoch and sequences and must land once."""
    result = Run(Options(duration_s=60, seed=13, kafka=True, clients=3,
                         workdir=str(tmp_path / "run"), keep=True)).execute()
    print(render(result))
    _assert_exercised(result)
    assert result["acked_by_transport"]["kafka"] > 500, result["acked_by_transport"]
    assert result["acked_by_transport"]["http"] > 0, result["acked_by_transport"]


# --- the harness's parts -----------------------------------------------------------------------

def test_should_draw_the_same_schedule_from_the_same_seed():
    first = schedule(Options(duration_s=120, seed=5))
    assert first == schedule(Options(duration_s=120, seed=5))
    assert first != schedule(Options(duration_s=120, seed=6))
    kinds = {a.kind for a in first}
    assert kinds == {"kill_ingestor", "kill_collector", "second_collector", "burst"}
    assert schedule(Options(duration_s=120, faults=False)) == []
    # the warm standby is the default: a kill of the active one first (the standby is warm
    # once load starts), then a --takeover; without it, a takeover first
    assert Options().standby
    collector = [a.kind for a in first if "collector" in a.kind]
    assert collector == ["kill_collector", "second_collector"] * 2
    cold = [a.kind for a in schedule(Options(duration_s=120, seed=5, standby=False))
            if "collector" in a.kind]
    assert cold == ["second_collector", "kill_collector"] * 2


def test_should_time_a_collector_change_from_its_log(tmp_path):
    """Kill -> ``took the queue at epoch N`` -> ``fenced ... at epoch N`` -> first commit:
    the lines of that epoch only (an earlier epoch's lines do not count)."""
    from datetime import datetime

    from testing.chaos.takeovers import _parts, describe, log_times

    log = tmp_path / "collector-1.log"
    log.write_text(
        "2026-12-02 17:27:00,000 INFO icefloe.collector: active: holder a took the queue "
        "at epoch 1\n"
        "2026-12-02 17:27:14,500 INFO icefloe.collector: active: holder b took the queue "
        "at epoch 12\n"
        "2026-12-02 17:27:15,250 INFO icefloe.collector: fenced 3 tables at epoch 12\n")
    active, fenced = log_times(log, 12)
    at = datetime(2026, 12, 2, 17, 27, 14, 500000).timestamp()
    assert (active, fenced) == (at, at + 0.75)
    assert log_times(log, 2) == (None, None)
    parts = _parts(at - 2.5, active, fenced, at + 3.0)
    assert parts == {"to_first_commit_s": 5.5, "lease_wait_s": 2.5, "fence_s": 0.75,
                     "start_and_first_run_s": 2.25}
    line, = describe([{"kind": "kill", "epoch": 12, "store_faults": False, **parts}])
    assert "first commit 5.50 s = lease 2.50 s + fence 0.75 s" in line


def test_should_give_kafka_producers_their_own_stream_keyed_by_kafka_ids(tmp_path):
    from testing.chaos.cluster import KAFKA_STREAM, StoreTarget, write_config

    plain = load_config(write_config(tmp_path, StoreTarget("file:///s")), env={})
    assert [s.name for s in plain.streams] == ["chaos_http", "chaos_grpc"]
    config = load_config(write_config(tmp_path, StoreTarget("file:///s"), kafka=True), env={})
    kafka = {s.name: s for s in config.streams}[KAFKA_STREAM]
    assert kafka.event_id_field is None  # the producer id, epoch and sequence are the ids
    assert kafka.kafka_partitions == 2
    assert {s.name: s.event_id_field for s in config.streams if s is not kafka} == {
        "chaos_http": "id", "chaos_grpc": "id"}


def _rows(ids: list[str], seqs: list[int]) -> TableRows:
    n = len(ids)
    return TableRows(ids, np.array(seqs), np.full(n, 1_000), np.full(n, 2_500))


def test_should_catch_lost_duplicated_and_never_sent_events(tmp_path):
    config = load_config(None, env={}, overrides={
        "store": {"url": (tmp_path / "store").as_uri()},
        "catalog": {"uri": f"sqlite:///{tmp_path / 'c.db'}",
                    "warehouse": (tmp_path / "wh").as_uri()}})
    clean = verify(config, {"t": _rows(["a", "b", "c"], [0, 0, 1])}, {"a", "b"}, {"c"})
    assert clean.ok, clean.checks
    assert clean.unacked_stored == 1
    broken = verify(config, {"t": _rows(["a", "a", "x"], [0, 3, 1])}, {"a", "b"}, set())
    assert not broken.ok
    assert broken.lost == ["b"]
    assert broken.duplicates == {"a": [0, 3]}  # with the sequences where it happened
    assert broken.phantoms == ["x"]


def test_should_measure_freshness_from_snapshot_times():
    rows = TableRows(["a", "b"], np.array([0, 1]), np.array([1_000, 5_000]),
                     np.array([2_000, 5_500]))
    result = freshness({"t": rows}, windows=[(4.0, 6.0)])
    assert result["all"]["max"] == 1.0
    assert result["during_faults"] == {"p50": 0.5, "p99": 0.5, "max": 0.5}


def test_should_switch_store_faults_on_and_off_through_the_file(tmp_path, monkeypatch):
    faults = tmp_path / "faults.json"
    monkeypatch.setenv(FAULTS_ENV, str(faults))

    async def scenario() -> list[str]:
        store = open_async_store((tmp_path / "s").as_uri())
        seen = []
        try:
            await store.put("k", b"1")  # no file: no faults
            faults.write_text(json.dumps({"rules": [
                {"kind": "fail", "probability": 1.0, "times": None, "ops": ["get"]}]}))
            os.utime(faults, ns=(1, 10**18))  # a new mtime even within the same tick
            inner = store.inner  # under the retry layer
            assert isinstance(inner, FileDrivenFaultyStore)
            inner.spec._checked = 0.0  # skip the 0.2 s look-again pause
            try:
                await inner.get("k")
            except TransientStoreError as exc:
                seen.append(exc.code)
            faults.write_text("{}")
            os.utime(faults, ns=(2, 2 * 10**18))
            inner.spec._checked = 0.0  # skip the 0.2 s look-again pause
            seen.append((await inner.get("k")).data.decode())
        finally:
            await store.close()
        return seen

    assert asyncio.run(scenario()) == ["InternalError", "1"]
    assert Path(f"{faults}.log").read_text().split()[1:] == ["fail", "get"]


def test_should_read_durations_with_units():
    assert parse_duration("90") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("2h") == 7200


def test_should_break_s3_on_the_wire_from_the_faults_file(tmp_path, aws_test_env):
    """The S3 server of a chaos run answers 503/500, cuts connections, and applies a PUT
    whose answer never arrives — over real HTTP, for any client."""
    import boto3
    import botocore.exceptions
    from botocore.config import Config as BotoConfig

    from testing.chaos.http_faults import start_moto

    faults = tmp_path / "faults.json"
    server = start_moto(str(faults))
    try:
        server.bucket_url("wire")
        s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}))

        def rules(*items: dict) -> None:
            faults.write_text(json.dumps({"rules": [{"layer": "http", **i} for i in items]}))
            time.sleep(0.25)  # the server looks at the file at most every 0.2 s

        rules({"kind": "lose_response", "methods": ["PUT"]})
        with pytest.raises((botocore.exceptions.ConnectionError,
                            botocore.exceptions.HTTPClientError)):
            s3.put_object(Bucket="wire", Key="k", Body=b"applied")
        rules()
        assert s3.get_object(Bucket="wire", Key="k")["Body"].read() == b"applied"
        rules({"kind": "slowdown", "methods": ["GET"]})
        with pytest.raises(botocore.exceptions.ClientError, match="SlowDown"):
            s3.get_object(Bucket="wire", Key="k")
        rules({"kind": "reset", "methods": ["GET"]})
        with pytest.raises((botocore.exceptions.ConnectionError,
                            botocore.exceptions.HTTPClientError)):
            s3.get_object(Bucket="wire", Key="k")
        rules()
        assert s3.get_object(Bucket="wire", Key="k")["Body"].read() == b"applied"
    finally:
        server.stop()
    logged = [line.split()[1] for line in Path(f"{faults}.log").read_text().splitlines()]
    # (botocore may retry a cut connection once more: compare the kinds, in order)
    assert list(dict.fromkeys(logged)) == ["http-lose_response", "http-slowdown", "http-reset"]
