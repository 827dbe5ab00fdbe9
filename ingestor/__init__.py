"""ingestor package."""
