"""OTLP from the command line (issue #41): ``icefloe up`` serves OTLP's ports with ``[otlp]``
on unless ``--no-otlp``, and ``icefloe ingestor`` reports the OTLP ports it bound.

OTLP's defaults are 4318 (HTTP) and 4317 (gRPC); these tests pass 0 (any free port) so
they never collide with a collector or another test on the machine.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
from otel_sdk import export, record
from process_support import Child, write_config

EXAMPLE_STREAMS = {"pageviews", "orders"}


def start_up(tmp_path: Path, *flags: str) -> Child:
    return Child(["up", "--data-dir", str(tmp_path / "data"), "--http-port", "0",
                  "--grpc-port", "0", "--kafka-port", "0", "--no-collector", *flags],
                 tmp_path, tmp_path / "up.log")


def test_should_serve_otlp_on_its_ports_with_up(tmp_path):
    child = start_up(tmp_path, "--otlp-http-port", "0", "--otlp-grpc-port", "0")
    try:
        line = child.wait_line(lambda text: text.strip().startswith("OTLP"), 60)
        http_url = line.split()[1]
        grpc_address = line.split()[3]
        assert http_url.startswith("http://127.0.0.1:")
        telemetry = record(logs=2, spans=1)
        assert export("http", http_url, None, telemetry) == ("SUCCESS",) * 3
        assert export("grpc", grpc_address, None, telemetry) == ("SUCCESS",) * 3
        streams = child.wait_line(lambda text: text.strip().startswith("streams"), 10)
        assert "otlp.logs" in streams
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()
    assert "Traceback" not in (tmp_path / "up.log").read_text(errors="replace")


def test_should_serve_no_otlp_with_up_no_otlp(tmp_path):
    child = start_up(tmp_path, "--no-otlp")
    try:
        line = child.wait_line(lambda text: text.strip().startswith("HTTP"), 60)
        base = line.split()[1].split("/v1/")[0]
        streams = child.wait_line(lambda text: text.strip().startswith("streams"), 10)
        answer = httpx.post(f"{base}/v1/logs", content=b"", timeout=10,
                            headers={"Content-Type": "application/x-protobuf"})
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()
    assert not any(seen.strip().startswith("OTLP") for seen in child.seen)
    assert set(streams.split(None, 1)[1].strip().split(", ")) == EXAMPLE_STREAMS
    assert answer.status_code == 404


def test_should_report_the_otlp_ports_in_the_ready_line(tmp_path):
    path = write_config(tmp_path)
    path.write_text(path.read_text() + "\n[otlp]\nenabled = true\n")
    child = Child(["ingestor", "--config", str(path), "--http-port", "0", "--grpc-port", "0",
                   "--otlp-http-port", "0", "--otlp-grpc-port", "0"], tmp_path,
                  tmp_path / "ingestor.log")
    try:
        ready = child.ready()
        assert ready["otlp_http_port"] > 0
        assert ready["otlp_grpc_port"] > 0
        assert ready["kafka_port"] is None
        telemetry = record(logs=1, spans=1)
        assert export("http", f"http://127.0.0.1:{ready['otlp_http_port']}", None,
                      telemetry) == ("SUCCESS",) * 3
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()


def test_should_refuse_an_otlp_port_with_otlp_off(tmp_path):
    path = write_config(tmp_path)
    child = Child(["ingestor", "--config", str(path), "--http-port", "0", "--grpc-port", "0",
                   "--otlp-http-port", "0"], tmp_path, tmp_path / "ingestor.log")
    try:
        assert child.proc.wait(60) == 2
    finally:
        child.close()
    assert "ingestor.otlp_http_port is set but [otlp] is off" in child.tail()
