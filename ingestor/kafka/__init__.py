"""Kafka produce-protocol listener: producer ids, synthetic offsets and the wire."""
