"""Everything that writes Iceberg, and the only place that touches pyiceberg internals.

``catalog`` (open one from config) · ``tables`` (create or evolve a stream's table, its
Iceberg schema) · ``commit`` (the exactly-once commit) with ``confirm`` (settling an unknown
outcome) · ``fence`` (taking tables over) · ``data_files`` (writing Parquet data files and
adding them) · ``file_append`` (the embedded path's append) · ``maintenance``. It imports
neither pyspark nor :mod:`pipeline.load`; the Arrow side of the schema it shares with
them is :mod:`pipeline.columns`.
"""

from pipeline.iceberg.pyiceberg_fixes import install_when_imported as _install_fixes

_install_fixes()  # null lists of structs survive pyiceberg's writes and scans (installed
# when pyiceberg's Arrow module loads: importing it here would cost every reader pandas)
