"""Everything that writes Iceberg: catalog, tables, the exactly-once commit, maintenance."""
