"""The ``icefloe`` CLI: inspect, probe, up — output and one-line errors with exit codes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from icefloe.formats.batch import Compression, encode_batch
from icefloe.formats.envelope import encode_envelope
from icefloe.manifest import (
    BatchRef,
    ManifestConfig,
    ManifestConsumer,
    ManifestProducer,
    ShardedProducer,
    grow_shards,
)
from icefloe.store import open_async_store
from icefloe.store.local import LocalStore
from icefloe.store.probe import PROBE_PREFIX
from icefloe_app.cli import main


def make_batch(path, count: int = 3) -> bytes:
    records = [encode_envelope("pageviews", f"id-{i}", 1_790_000_000_000 + i,
                               b'{"user_id":"u%d"}' % i) for i in range(count)]
    data = encode_batch(records, Compression.ZSTD)
    path.write_bytes(data)
    return data


def fill_manifest(url: str, count: int) -> None:
    async def run() -> None:
        store = open_async_store(url)
        consumer = ManifestConsumer(store, holder="collector-test")
        await consumer.initialize()
        producer = ManifestProducer(store)
        for i in range(count):
            await producer.append(BatchRef(f"batches/b{i}.ifb", 100 + i, 7, 10,
                                           ("pageviews",), time.time()))
        await consumer.ack(0)

    asyncio.run(run())


def test_should_print_the_manifest_as_a_table_and_as_json(tmp_path, capsys):
    url = (tmp_path / "store").as_uri()
    fill_manifest(url, 3)
    assert main(["inspect", "manifest", "--store", url, "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "epoch 1, holder collector-test" in out
    assert "acked through 0" in out
    assert "3 entries (30 records), sequences 0..2, next 3" in out
    assert "batches/b1.ifb" in out
    assert "batches/b2.ifb" not in out
    assert "1 more" in out
    assert main(["inspect", "manifest", "--store", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["next_sequence"] == 3
    assert [e["location"] for e in data["entries"]] == [f"batches/b{i}.ifb" for i in range(3)]
    assert data["consumer"]["acked_through"] == 0


def test_should_show_every_manifest_shard(tmp_path, capsys):
    url = (tmp_path / "store").as_uri()
    fill_manifest(url, 2)

    async def grow() -> None:
        store = open_async_store(url)
        config = ManifestConfig()
        await grow_shards(store, config.key, 3, backoff=config.conflict_backoff)
        await ShardedProducer(store, shard=2).append(BatchRef(
            "batches/ab/on-shard-2.ifb", 100, 7, 10, ("pageviews",), time.time()))
        await store.close()

    asyncio.run(grow())
    assert main(["inspect", "manifest", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "shards    3 (manifest/queue.shards), 3 entries queued in all" in out
    assert "--- shard 1 ---\nmanifest  manifest/queue-shard1: not written yet" in out
    assert "/ manifest/queue-shard2" in out
    assert "batches/ab/on-shard-2.ifb" in out
    assert main(["inspect", "manifest", "--store", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shard_count"] == 3
    assert data["next_sequence"] == 2  # shard 0 at the top level, as before
    assert [s["entry_count"] for s in data["shards"]] == [2, 0, 1]
    assert data["shards"][2]["entries"][0]["location"] == "batches/ab/on-shard-2.ifb"


def test_should_say_when_there_is_no_manifest(tmp_path, capsys):
    url = (tmp_path / "empty").as_uri()
    assert main(["inspect", "manifest", "--store", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("icefloe: error: no manifest at")
    assert err.count("\n") == 1


def test_should_inspect_a_batch_file(tmp_path, capsys):
    path = tmp_path / "b.ifb"
    make_batch(path, 4)
    assert main(["inspect", "batch", str(path), "--records", "2"]) == 0
    out = capsys.readouterr().out
    assert "version 1, zstd, 4 records" in out
    assert "pageviews=4" in out
    assert "id-1" in out
    assert "id-2" not in out
    assert main(["inspect", "batch", path.as_uri(), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["record_count"] == 4
    assert data["records"][0]["payload"] == '{"user_id":"u0"}'


def test_should_inspect_a_batch_file_on_s3(s3_bucket, capsys):
    from icefloe.store.s3 import S3Options, S3Store

    data = encode_batch([encode_envelope("clicks", "e1", 1, b"{}")])
    S3Store(s3_bucket.url, S3Options(endpoint_url=s3_bucket.endpoint_url)).put(
        "batches/x.ifb", data)
    location = s3_bucket.url.rstrip("/") + "/batches/x.ifb"
    assert main(["inspect", "batch", location, "--endpoint-url", s3_bucket.endpoint_url,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["streams"] == {"clicks": 1}


@pytest.mark.parametrize(("mangle", "reason"), [
    (lambda d: d[:5], "short_footer"),
    (lambda d: d[:-7] + b"\x07" + d[-6:], "unknown_compression"),
    (lambda d: d[:-3] + b"\x09" + d[-2:], "count_mismatch"),
])
def test_should_reject_a_corrupt_batch_in_one_line(tmp_path, capsys, mangle, reason):
    path = tmp_path / "b.ifb"
    data = make_batch(path)
    path.write_bytes(mangle(data))
    assert main(["inspect", "batch", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"icefloe: error: {reason}")
    assert err.count("\n") == 1


def test_should_probe_a_store(tmp_path, s3_bucket, capsys):
    assert main(["probe", "--store", (tmp_path / "s").as_uri()]) == 0
    assert main(["probe", "--store", s3_bucket.url, "--endpoint-url",
                 s3_bucket.endpoint_url]) == 0
    assert capsys.readouterr().out.count("ok: ") == 2


def test_should_time_durable_puts_after_the_probe_and_leave_none_behind(tmp_path, capsys):
    root = tmp_path / "s"
    assert main(["probe", "--store", root.as_uri(), "--puts", "7"]) == 0
    ok, puts, *notes = capsys.readouterr().out.splitlines()
    assert ok.startswith("ok: ")
    assert all(n.startswith("note: ") for n in notes)  # a journal-less ext4 (this VM) says so
    match = re.fullmatch(r"puts: p50 ([\d.]+) ms, p99 ([\d.]+) ms over 7 PUTs of 4 KiB .*",
                         puts)
    assert match is not None, puts
    assert 0 < float(match[1]) <= float(match[2])
    assert LocalStore(root).list(PROBE_PREFIX).objects == []


def test_should_skip_the_timed_puts_with_zero_and_refuse_a_negative_count(tmp_path, capsys):
    assert main(["probe", "--store", (tmp_path / "s").as_uri(), "--puts", "0"]) == 0
    assert "puts:" not in capsys.readouterr().out
    for bad, reason in (("-1", "--puts must be 0 or more, not -1"),
                        ("many", "--puts takes a whole number, not 'many'")):
        with pytest.raises(SystemExit) as refused:
            main(["probe", "--store", (tmp_path / "s").as_uri(), "--puts", bad])
        assert refused.value.code == 2
        assert reason in capsys.readouterr().err


def test_should_fail_in_one_line_for_a_missing_bucket(s3_bucket, capsys):
    url = "s3://no-such-bucket-icefloe/x"
    code = main(["probe", "--store", url, "--endpoint-url", s3_bucket.endpoint_url])
    assert code == 1
    err = capsys.readouterr().err
    assert "no-such-bucket-icefloe" in err
    assert "does not exist" in err


def test_should_refuse_an_unknown_store_scheme_as_a_config_error(capsys):
    assert main(["probe", "--store", "ftp://x/y"]) == 2
    assert "unsupported store url" in capsys.readouterr().err


def test_should_run_only_an_ingestor_with_up_no_collector(tmp_path):
    script = Path(sys.executable).parent / "icefloe"
    data = tmp_path / "data"
    # --no-collector: the ingestor half only, without Spark (the whole of `up` is covered by
    # a slow test in test_collector_cli.py).
    proc = subprocess.Popen([str(script), "up", "--data-dir", str(data), "--http-port", "0",
                             "--grpc-port", "0", "--kafka-port", "0", "--otlp-http-port",
                             "0", "--otlp-grpc-port", "0", "--no-collector"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        lines = []
        while not any(line.strip().startswith("HTTP") for line in lines):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            lines.append(line)
        url = next(line.split()[1] for line in lines if line.strip().startswith("HTTP"))
        response = httpx.post(url.replace("{stream}", "pageviews"),
                              json={"user_id": "u1", "url": "/"}, timeout=10)
        assert response.status_code == 202
        assert response.json() == {"accepted": 1}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert main(["inspect", "manifest", "--store", (data / "store").as_uri(), "--json"]) == 0


def test_should_run_as_a_console_script_with_help():
    script = Path(sys.executable).parent / "icefloe"
    result = subprocess.run([str(script), "inspect", "--help"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert "manifest" in result.stdout
    assert "batch" in result.stdout
