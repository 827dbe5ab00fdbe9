"""Which pip extra a command needs, so a light install says so instead of a traceback.

``pip install icefloe`` is the client only (``icefloe.client``). The servers and tools come
with extras; in an install without them, the ``icefloe`` command still runs, finds the
missing module and exits 2 with one line naming the extra to install. Only modules that
an extra brings count: any other missing module is a real bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

# import names of the distributions each extra adds (tests/system/test_packaging.py checks this
# against pyproject's extras, so a new dependency cannot slip past it)
INGESTOR_MODULES = frozenset({
    "zstandard", "ulid", "google_crc32c", "boto3", "botocore", "aiobotocore",
    "prometheus_client", "uvicorn", "grpc_health", "grpc_reflection", "sqlglot", "_jsonnet",
    "avro", "fastavro",  # Avro streams: schemas parsed, payloads checked at ingest
    "cramjam",  # the Kafka listener's snappy and lz4 record batches
    "opentelemetry",  # OTLP receivers: the export requests' generated messages
})
COLLECTOR_MODULES = frozenset({
    "starlette", "pyarrow", "numpy", "pandas", "pyspark", "pyiceberg", "duckdb",
    "grpc_tools", "jsonschema",  # the schema registry (icefloe admin)
    "polars",  # Avro batches decoded into Arrow (pipeline/load/avro_arrow.py)
    "ptars",  # Protobuf batches decoded into Arrow (pipeline/load/protobuf_arrow.py)
})

# the extra each command needs; commands not named here need the ingestor's core
COMMAND_EXTRA = {
    "ingestor": "ingestor",
    "collector": "collector",
    "admin": "collector",
    "up": "all",
    "demo": "all",
    "query": "collector",
    "sql": "collector",
    "run": "collector",
    "models": "collector",
    "tables": "collector",
    "deadletters": "collector",
}


def extra_for(command: str | None, missing: str | None) -> str | None:
    """The extra to install when ``command`` failed importing ``missing``; None when the
    module is not one an extra brings (then the error is a bug, not an install choice)."""
    top = (missing or "").split(".")[0]
    if top not in INGESTOR_MODULES | COLLECTOR_MODULES:
        return None
    wanted = COMMAND_EXTRA.get(command, "ingestor") if command else "all"
    if top in COLLECTOR_MODULES and wanted == "ingestor":
        return "collector"
    return wanted


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command in ``argv`` (its first word that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def needs_extra_line(command: str | None, extra: str) -> str:
    """The one line printed on stderr."""
    what = f"icefloe {command}" if command else "the icefloe command"
    return f"{what} needs the [{extra}] extra: pip install 'icefloe[{extra}]'"
