"""One long-lived SparkSession for the collector, configured for the Python data source.

Why long-lived: a new JVM costs 6-8 s and the first Python data source query another ~4.5 s
(worker start-up); the collector pays that once, then each run costs only its work. Why
these settings: workers must run this very interpreter (``PYSPARK_PYTHON``), timestamps must
come back as ``timestamp[us, tz=UTC]`` (session time zone UTC), and the driver binds to
loopback unless a cluster master is configured. Which of these a user may change through
``[collector] spark_conf`` is :data:`icefloe.config.validate.SPARK_FIXED`; the rest here
(UI, shuffle partitions, Arrow) are defaults a cluster may tune.

Spark's own log lines take the process's format: JSON lines like icefloe's when the
process logs JSON (:func:`icefloe.logs.setup_logging`), else one short text line each
(``log4j2.properties`` / ``log4j2-json.properties``); what the JVM writes past log4j is
wrapped into JSON lines too (:mod:`pipeline.jvm_stderr`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from icefloe.config.validate import spark_value
from icefloe.logs import JsonFormatter
from pipeline.java import require_java
from pipeline.jvm_stderr import stderr_as_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
LOG4J_JSON_CONFIG = Path(__file__).with_name("log4j2-json.properties")
_lock = threading.Lock()
_java_checked = False
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    # Spark 4.1+ has a TIME type but keeps it behind this (internal) flag: without it a
    # `time` column passes a plain read yet fails any count, aggregate or time function
    # with UNSUPPORTED_TIME_TYPE -- the collector's warm-up counted, and exited (#36).
    "spark.sql.timeType.enabled": "true",
    # An OutOfMemoryError in a task (one row's `sql` value asking for gigabytes) otherwise
    # makes the JVM exit -- in local mode the collector's own driver, so every table stops
    # and a restart replays the same run into the same death (#36). With depth 0 it fails
    # that task's job like any error, and the row path isolates the row (pipeline.load.mapped).
    "spark.executor.killOnFatalError.depth": "0",
}


def get_spark(master: str = "local[2]", app_name: str = "icefloe",
              conf: Mapping[str, str] | None = None) -> SparkSession:
    """The process's SparkSession (created once), with the icefloe data source registered."""
    with _lock:
        global _java_checked
        if not _java_checked:
            require_java()
            _java_checked = True
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession  # lazy: pyspark

        builder = SparkSession.builder.master(master).appName(app_name)
        settings = {**DEFAULT_CONF, **{k: spark_value(v) for k, v in (conf or {}).items()}}
        settings["spark.driver.extraJavaOptions"] = _java_options(
            settings.get("spark.driver.extraJavaOptions", ""))
        for key, value in settings.items():
            builder = builder.config(key, value)
        if master.startswith("local"):
            builder = builder.config("spark.driver.host", "127.0.0.1").config(
                "spark.driver.bindAddress", "127.0.0.1")
        with stderr_as_json(_logs_json()):  # the JVM inherits a stderr of JSON lines
            spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        from pipeline.load.source import IcefloeDataSource  # lazy: pyspark

        spark.dataSource.register(IcefloeDataSource)
        from pipeline.read.iceberg_source import (  # lazy: pyspark
            register as register_iceberg_source,
        )

        register_iceberg_source(spark)  # format "icefloe-iceberg"
        return spark


def _logs_json() -> bool:
    """Whether this process logs JSON lines (its root handler formats JSON)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def _java_options(given: str) -> str:
    """The driver's JVM options: the caller's, plus icefloe's log4j profile in the process's
    log format unless the caller names a log4j configuration of its own."""
    if "log4j2.configurationFile" in given:
        return given
    profile = LOG4J_JSON_CONFIG if _logs_json() else LOG4J_CONFIG
    return f"{given} -Dlog4j2.configurationFile={profile.as_uri()}".strip()
