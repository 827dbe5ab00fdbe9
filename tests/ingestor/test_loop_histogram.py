"""The event loop's lock-free histogram exposes what prometheus_client's own would."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ingestor.loop_histogram import LoopHistogram
from ingestor.metrics import IngestMetrics

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def test_should_expose_what_the_library_histogram_exposes_for_the_same_observations() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("acks", "ack latency", ["transport"], buckets=BUCKETS, registry=ours)
    library = Histogram("acks", "ack latency", ["transport"], buckets=BUCKETS,
                        registry=theirs)
    rng = random.Random(7)
    # bounds themselves (le is inclusive), values past the last bound, and zero
    values = [*BUCKETS, 0.0, 31.0, 1e9] + [rng.expovariate(200) for _ in range(500)]
    for value in values:
        for transport in ("http", "grpc"):
            loop.labels(transport).observe(value)
            library.labels(transport).observe(value)
    assert exposition(ours) == exposition(theirs)
    assert f'acks_count{{transport="http"}} {float(len(values))}' in exposition(ours)


def test_should_show_an_unlabelled_histogram_at_zero_before_its_first_observation() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("flush", "flush time", buckets=(0.1, 1), registry=registry)
    assert 'flush_bucket{le="+Inf"} 0.0' in exposition(registry)
    histogram.observe(0.5)
    lines = exposition(registry)
    assert 'flush_bucket{le="0.1"} 0.0' in lines
    assert 'flush_bucket{le="1.0"} 1.0' in lines
    assert "flush_sum 0.5" in lines


def test_should_refuse_wrong_labels_and_bad_buckets_by_name() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("acks", "ack latency", ["transport"], buckets=(1, 2),
                              registry=registry)
    with pytest.raises(ValueError, match=r"acks takes labels \('transport',\)"):
        histogram.labels("http", "extra")
    with pytest.raises(ValueError, match="has labels"):
        histogram.observe(1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        LoopHistogram("x", "x", buckets=(2, 1), registry=CollectorRegistry())


def test_should_keep_the_ingestor_metric_names_types_and_labels() -> None:
    """Dashboards and alert rules read these names: the swap must not change them."""
    metrics = IngestMetrics()
    metrics.ack_seconds.labels("http").observe(0.004)
    metrics.flush_seconds.observe(0.003)
    metrics.batch_bytes.observe(2048)
    metrics.batch_events.observe(7)
    text = exposition(metrics.registry)
    for name in ("icefloe_ingest_ack_seconds", "icefloe_ingest_flush_seconds",
                 "icefloe_ingest_batch_bytes", "icefloe_ingest_batch_events"):
        assert f"# TYPE {name} histogram" in text
    assert 'icefloe_ingest_ack_seconds_count{transport="http"} 1.0' in text
    assert 'icefloe_ingest_batch_events_bucket{le="10.0"} 1.0' in text
