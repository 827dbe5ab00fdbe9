"""OpenTelemetry's protocol (OTLP, issue #41): the core's part.

OTLP data lands in ordinary JSON streams with native-typed columns that icefloe generates
from the ``[otlp]`` config section, one per kind of row (:mod:`~icefloe.otlp.kinds`): the
columns are :mod:`~icefloe.otlp.schemas`', the streams :mod:`~icefloe.otlp.config`'s, and
:mod:`~icefloe.otlp.rows` turns an export request into their rows. Why streams and not a
path of its own: the ingestor's validation, buffering and exactly-once ids, and the
collector's tables, partitioning and dedup, then serve OTLP without a line of new code.
The receivers that decode requests are the ingestor's (``ingestor/otlp``).
"""
