"""Java Iceberg's own reader for tests: Spark 3.5 with ``iceberg-spark-runtime`` 1.10.2.

Where it comes from (only package indexes are reachable here): PySpark 3.5 and the wheel
``snowpark-connect-deps-iceberg``, which carries ``iceberg-spark-runtime-3.5_2.12-1.10.2.jar``,
installed in their own venv (``make iceberg-java`` → ``.venv/tools/iceberg-java``; the
project's venv has PySpark 4). That jar lacks the Jackson classes Iceberg shades
(``org.apache.iceberg.shaded.com.fasterxml.jackson``): :func:`relocate_jackson` makes them
from PySpark 3.5's own Jackson jars by rewriting each class file's constant pool, which is
what a shading plugin does. ``ICEFLOE_ICEBERG_JAVA_PYTHON`` points at another Python that
has both packages.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
_OLD_PATH = b"com/fasterxml/jackson/"
_NEW_PATH = b"org/apache/iceberg/shaded/" + _OLD_PATH
_OLD_NAME = b"com.fasterxml.jackson."
_NEW_NAME = b"org.apache.iceberg.shaded." + _OLD_NAME
# Constant pool entry sizes after the tag, by tag (JVM spec 4.4); 1 (UTF-8) is rewritten.
_SIZES = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2,
          17: 4, 18: 4, 19: 2, 20: 2}

PROBE = """
import json, sys
from pyspark.sql import SparkSession
jars, spec = sys.argv[1], json.loads(sys.argv[2])
spark = (SparkSession.builder.master("local[1]").appName("icefloe-iceberg-java")
         .config("spark.jars", jars).config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.memory", "512m").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
answers = []
for metadata, queries in spec:
    spark.read.format("iceberg").load(metadata).createOrReplaceTempView("t")
    answers.append([[list(row) for row in spark.sql(q).collect()] for q in queries])
print("ANSWERS " + json.dumps(answers, default=str))
spark.stop()
"""


def java_python() -> Path:
    path = Path(os.environ.get("ICEFLOE_ICEBERG_JAVA_PYTHON")
                or ROOT / ".venv" / "tools" / "iceberg-java" / "bin" / "python")
    if not path.exists():
        pytest.fail(f"Spark 3.5 with Iceberg's runtime is not installed at {path}: run "
                    "`make iceberg-java` (or `make test-slow`), or point "
                    "ICEFLOE_ICEBERG_JAVA_PYTHON at a Python with pyspark 3.5 and "
                    "snowpark-connect-deps-iceberg", pytrace=False)
    return path


def _site_packages(python: Path, package: str) -> Path:
    done = subprocess.run([str(python), "-c", f"import {package}, os; "
                           f"print(os.path.dirname({package}.__file__))"],
                          capture_output=True, text=True, timeout=60, check=True)
    return Path(done.stdout.strip())


def _rewrite_class(data: bytes) -> bytes:
    """The class file with every UTF-8 constant's Jackson package moved under Iceberg's."""
    count = struct.unpack_from(">H", data, 8)[0]
    out, pos, index = [data[:10]], 10, 1
    while index < count:
        tag = data[pos]
        if tag == 1:
            size = struct.unpack_from(">H", data, pos + 1)[0]
            text = data[pos + 3:pos + 3 + size].replace(_OLD_PATH, _NEW_PATH).replace(
                _OLD_NAME, _NEW_NAME)
            out.append(bytes([1]) + struct.pack(">H", len(text)) + text)
            pos += 3 + size
        else:
            out.append(data[pos:pos + 1 + _SIZES[tag]])
            pos += 1 + _SIZES[tag]
            index += tag in (5, 6)  # longs and doubles take two slots
        index += 1
    out.append(data[pos:])
    return b"".join(out)


def relocate_jackson(jars: list[Path], target: Path) -> Path:
    """One jar of ``jars``' classes relocated to Iceberg's shaded Jackson package."""
    seen: set[str] = set()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for jar in jars:
            with zipfile.ZipFile(jar) as source:
                for info in source.infolist():
                    name = info.filename
                    if not name.endswith(".class") or "module-info" in name or \
                            name.startswith("META-INF/"):
                        continue
                    name = name.replace(_OLD_PATH.decode(), _NEW_PATH.decode())
                    if name not in seen:
                        seen.add(name)
                        out.writestr(name, _rewrite_class(source.read(info.filename)))
    return target


def java_iceberg(spec: list[tuple[str, list[str]]], work: Path) -> list[list[list[Any]]]:
    """Per (metadata JSON location, queries over view ``t``): each query's rows, as Spark
    with Iceberg's runtime 1.10.2 answers them."""
    python = java_python()
    pyspark_jars = _site_packages(python, "pyspark") / "jars"
    runtime = _site_packages(python, "snowpark_connect_deps_iceberg") / "jars" / \
        "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
    jackson = relocate_jackson(
        [next(pyspark_jars.glob(f"jackson-{part}-2.*.jar"))
         for part in ("core", "databind", "annotations")], work / "iceberg-jackson.jar")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_HOME", None)
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(python), "-c", PROBE, f"{runtime},{jackson}", json.dumps(spec)],
                          capture_output=True, text=True, timeout=600, check=False, env=env,
                          cwd=work)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines, done.stdout[-3000:]
    return json.loads(lines[-1].removeprefix("ANSWERS "))
