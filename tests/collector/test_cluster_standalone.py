"""The collector on a real Spark standalone cluster: a master and one worker started with
the ``spark-class`` pyspark ships (:mod:`testing.spark_standalone`), the collector a child
process with ``output = "cluster"``: plain tables, and a table template whose rows the
worker's executor names and writes (#42).

Why a child process: a process has one SparkContext, and the suite's session fixture is a
``local`` one.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow.compute as pc
import pytest
from collector_support import BASE_MS, click, publish_sync, read_table
from process_support import SPARK_TIMEOUT_S, Child, table_rows, wait_for, write_config

from icefloe.config import Column, StreamConfig, load_config
from testing.spark_standalone import DRIVER_CONF, Standalone, spark_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(200)  # a master alone: ~5 s
def test_should_find_the_masters_web_ui_when_its_picked_port_was_taken(tmp_path):
    cluster = Standalone(tmp_path, workers=0)
    picked = cluster.ui_port
    with socket.socket() as squatter:  # taken between the pick and the master's bind
        squatter.bind(("127.0.0.1", picked))
        squatter.listen()
        try:
            cluster.start()
            assert cluster.ui_port != picked  # Spark moved on, and so did we
            assert cluster.state()["url"] == cluster.url
            assert cluster.url.startswith("spark://127.0.0.1:")
        finally:
            cluster.stop()


@pytest.mark.timeout(300)  # ~45 s (60-70 s on 2 busy cores): master, worker, driver, executor
def test_should_commit_exactly_once_through_a_standalone_cluster(tmp_path, standalone):
    path = write_config(tmp_path, spark_master=standalone.url, output="cluster",
                        spark_partitions=2)
    with path.open("a") as file:  # the executors on this machine reach the driver here
        file.write("[collector.spark_conf]\n" + "".join(
            f'"{key}" = "{value}"\n' for key, value in DRIVER_CONF.items()))
    config = load_config(path)
    publish_sync(config, [[click(i) for i in range(k, k + 40)] for k in (0, 40, 80)])
    child = Child(["collector", "--config", str(path)], tmp_path, tmp_path / "collector.log",
                  env=spark_env())
    try:
        child.ready()
        wait_for(lambda: table_rows(config, "web.clicks") == 120, SPARK_TIMEOUT_S,
                 "120 rows committed through the cluster")
        apps = standalone.state().get("activeapps", [])
        assert [app["name"] for app in apps] == ["icefloe-collector"]
        assert apps[0]["cores"] == 1  # the worker's executor ran the job
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()
    rows = read_table(config, "web.clicks")
    assert sorted(pc.unique(rows.column("_event_id")).to_pylist()) == sorted(
        f"c{i}" for i in range(120))
    assert rows.num_rows == 120
    log = (tmp_path / "collector.log").read_text(errors="replace").splitlines()
    not_json = [line for line in log if line.strip() and not _is_json(line)]
    assert not_json == [], not_json  # Spark's own lines are JSON lines too
    assert any('"run sequences' in line for line in log)


TENANTS = StreamConfig(name="events", table="tenants.t_{lower(tenant)}", columns=(
    Column("tenant", "string"), Column("n", "long")))


@pytest.mark.timeout(300)  # as above
def test_should_write_a_table_templates_tables_through_a_standalone_cluster(tmp_path,
                                                                            standalone):
    path = write_config(tmp_path, (TENANTS,), spark_master=standalone.url, output="cluster",
                        spark_partitions=2)
    with path.open("a") as file:
        file.write("[collector.spark_conf]\n" + "".join(
            f'"{key}" = "{value}"\n' for key, value in DRIVER_CONF.items()))
    config = load_config(path)
    names = ["Acme", "globex", "ACME", None]
    publish_sync(config, [[("events", f"e{i}", BASE_MS + i, msgspec.json.encode(
        {"n": i, **({"tenant": names[i % 4]} if names[i % 4] else {})}))
        for i in range(k, k + 20)] for k in (0, 20)])
    child = Child(["collector", "--config", str(path)], tmp_path, tmp_path / "collector.log",
                  env=spark_env())
    try:
        child.ready()
        wait_for(lambda: table_rows(config, "icefloe.dead_letters") == 10, SPARK_TIMEOUT_S,
                 "the run's tables and its dead letters committed through the cluster")
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()
    acme = read_table(config, "tenants.t_acme").column("_event_id").to_pylist()
    assert sorted(acme) == sorted(f"e{i}" for i in range(40) if i % 4 in (0, 2))
    globex = read_table(config, "tenants.t_globex").column("_event_id").to_pylist()
    assert sorted(globex) == sorted(f"e{i}" for i in range(40) if i % 4 == 1)
    dead = read_table(config, "icefloe.dead_letters")
    assert set(dead.column("reason").to_pylist()) == {"dynamic_table:null_value"}
    log = (tmp_path / "collector.log").read_text(errors="replace")
    assert "takes the embedded path" not in log  # the cluster path wrote the tables


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
