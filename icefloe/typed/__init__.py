"""Producers' own types (#39): a stream whose events are Protobuf messages or Avro records.

Why a package of its own: the type a producer already has (a ``.proto`` message, an Avro
schema) becomes the stream's schema, so the columns, the ingestor's check of each payload,
the collector's decode into Arrow and the evolution rules all come from one parsed type.
The formats live in :mod:`icefloe.typed.protobuf` and :mod:`icefloe.typed.avro`; what they
share (the column they derive, their errors, the payload format codes of the envelope)
lives in :mod:`icefloe.typed.codec`.
"""
