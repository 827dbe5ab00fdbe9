"""icefloe: an object-store-native ingest cluster.

The ``icefloe`` package is the shared core: batch files, record envelopes, the object-store
layer, the fenced manifest queue, configuration and the CLI. It runs no servers itself; the
``ingestor``, ``collector`` and ``pipeline`` packages build on it.
"""

__version__ = "0.1.0"
