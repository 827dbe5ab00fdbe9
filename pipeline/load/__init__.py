"""Batch files into Arrow tables and Spark frames: what a collector run reads.

Bottom to top, each module importing only modules listed before it: ``spec`` (a run as
plain data: its files, streams, mapping columns) · ``frame`` (the wide frame's column
names and schema) · ``split`` (the columnar envelope split) · ``mapped`` (mapping columns)
· ``decode`` (one batch file → tables and dead letters) · ``fetch`` (read, verify,
quarantine) · ``packed`` (the packed Spark rows) · ``source`` (the ``icefloe`` Spark data
source) · ``executors`` (the cluster output path) · ``run`` (a run's result, locally or on
Spark). Nothing is re-exported, so importing one module loads no Spark.
"""
