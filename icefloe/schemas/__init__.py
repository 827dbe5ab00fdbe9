"""The schema registry: Avro, Protobuf and JSON schemas by subject, version and global id,
with compatibility checks, kept in the object store (served by the admin process's
Confluent-compatible paths, :mod:`icefloe_app.api.schema_registry`)."""
