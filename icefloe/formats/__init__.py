"""The on-store formats: batch files and the record envelope (plus their compiled hot loops)."""
