"""The on-store formats, byte for byte (``docs/formats.md`` documents them for other languages).

- :mod:`~icefloe.formats.batch`: batch files, length-prefixed records in one zstd frame with
  a 7-byte footer; building, reading and splitting them, with the framing checks every
  splitter shares (``framing_error``, ``check_block_end``);
- :mod:`~icefloe.formats.envelope`: the record envelope (stream, event id, receive time,
  request metadata) in front of each event's canonical JSON, and splitting a block by stream;
- :mod:`~icefloe.formats.speedups`: the optional compiled hot loops (``_speedups.pyx``), or
  None where they were not built; results are the same either way.
"""
