"""OTLP receivers (issue #41): OTLP/HTTP and OTLP/gRPC export requests through icefloe's one
admission path, into the streams the ``[otlp]`` section generates (docs/otlp-receivers.md)."""
