"""Batch files into Arrow tables: fetch, decode, mapped columns and the Spark data source."""
