"""Reading icefloe's tables back: pinned-snapshot queries and the Spark reader.

``query`` (a SQL query over pinned snapshots) · ``iceberg_source`` (the Spark Python data
source that plans files with pyiceberg and reads them in Spark tasks).
"""
