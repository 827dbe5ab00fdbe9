"""Streams, the core's model of what is ingested: columns, their types, their mappings.

- :mod:`~icefloe.streams.model`: :class:`Column`, :class:`RateLimit`, :class:`StreamConfig`;
- :mod:`~icefloe.streams.types`: what each column type accepts (:func:`convert_value`);
- :mod:`~icefloe.streams.mappings`: ``path``/``header``/``from``/``sql`` parsing and checks;
- :mod:`~icefloe.streams.sql_functions`: the functions a ``sql`` mapping may call;
- :mod:`~icefloe.streams.check`: one stream's rules (:func:`validate_stream`).

It imports nothing of :mod:`icefloe.config`, which builds on it; the ingestor's compiled
validator (:mod:`ingestor.validate`) and the pipeline's decode read it.
"""

from icefloe.streams.check import validate_stream
from icefloe.streams.model import (
    COLUMN_TYPES,
    PARTITIONS,
    Column,
    EvolveQuota,
    RateLimit,
    StreamConfig,
)
from icefloe.streams.types import convert_value

__all__ = ["COLUMN_TYPES", "PARTITIONS", "Column", "EvolveQuota", "RateLimit", "StreamConfig",
           "convert_value", "validate_stream"]
