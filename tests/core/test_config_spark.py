"""``[collector] spark_conf``: spark.* settings pass through; icefloe's own are refused."""

from __future__ import annotations

import pytest
from config_support import load_text, write_config

from icefloe.config import load_config
from icefloe.errors import ConfigError
from tests.core.test_config import MINIMAL


def load(tmp_path, collector: str):
    return load_text(tmp_path, MINIMAL + "[collector]\n" + collector)


def test_should_pass_spark_settings_through(tmp_path):
    config = load(tmp_path, 'spark_master = "spark://10.0.0.5:7077"\n'
                  '[collector.spark_conf]\n"spark.executor.memory" = "4g"\n'
                  '"spark.executor.cores" = 2\n"spark.eventLog.enabled" = true\n'
                  '"spark.master" = "spark://10.0.0.5:7077"\n'
                  '"spark.driver.host" = "10.0.0.9"\n'
                  '"spark.sql.session.timeZone" = "UTC"\n')
    from collector.runner import spark_settings

    assert spark_settings(config) == {
        "spark.executor.memory": "4g", "spark.executor.cores": 2,
        "spark.eventLog.enabled": True, "spark.master": "spark://10.0.0.5:7077",
        "spark.driver.host": "10.0.0.9", "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g"}


@pytest.mark.parametrize(("setting", "words"), [
    ('"spark.master" = "yarn"', ["'spark.master'", "collector.spark_master"]),
    ('"spark.driver.memory" = "8g"', ["'spark.driver.memory'",
                                      "collector.spark_driver_memory"]),
    ('"spark.sql.session.timeZone" = "Europe/Prague"', ["'spark.sql.session.timeZone'",
                                                        "UTC"]),
    ('"spark.ui.showConsoleProgress" = true', ["'spark.ui.showConsoleProgress'"]),
    ('"spark.python.worker.reuse" = false', ["'spark.python.worker.reuse'"]),
    ('"spark.submit.deployMode" = "cluster"', ["'spark.submit.deployMode'"]),
    ('"spark.sql.timeType.enabled" = false', ["'spark.sql.timeType.enabled'", "TIME"]),
    ('"spark.pyspark.driver.python" = "/usr/bin/python3"',
     ["'spark.pyspark.driver.python'"]),
    ('"spark.driver.host" = "10.0.0.9"', ["'spark.driver.host'", "local[2]"]),
    ('"executor.memory" = "4g"', ["'executor.memory'", "spark.*"]),
    ('"spark.executor.memory" = ["4g"]', ["'spark.executor.memory'", "string"]),
    ('"spark.executor.memory" = { size = "4g" }', ["'spark.executor.memory'"]),
])
def test_should_refuse_settings_icefloe_owns_and_malformed_ones(tmp_path, setting, words):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[collector.spark_conf]\n{setting}\n")
    assert "collector.spark_conf" in str(caught.value)
    for word in words:
        assert word in str(caught.value)


def test_should_keep_spark_conf_out_of_the_environment(tmp_path):
    """File only: set in the environment it is refused by name, never ignored."""
    with pytest.raises(ConfigError, match="ICEFLOE_COLLECTOR_SPARK_CONF"):
        load_config(write_config(tmp_path, MINIMAL),
                    env={"ICEFLOE_COLLECTOR_SPARK_CONF": "spark.x=1"})
