"""Compatibility of a new schema with a subject's earlier ones, per level.

Every check asks one question: can data written with ``writer`` be read with ``reader``?
BACKWARD: the new schema reads the latest version's data (TRANSITIVE: every live version's);
FORWARD: the earlier versions read the new schema's data; FULL: both; NONE: nothing checked.

- Avro: Apache ``avro``'s own checker (``avro.compatibility``), which implements Avro's
  schema resolution: fields added need a default, promotions int→long→float→double and
  string↔bytes, unions, enum symbols, fixed sizes, names, nested records.
- Protobuf: for every message both files define (by full name), a field number present in
  both must keep its type (message and enum fields their type name) and label; a removed or
  added field is compatible (wire format), a renamed one too.
- JSON Schema: the keywords listed in :data:`JSON_STRUCTURAL`, :data:`JSON_CONSTRAINTS` and
  :data:`JSON_IGNORED`; any other keyword is reported as not checked (incompatible), never
  passed over silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icefloe.schemas.formats import Parsed

JSON_STRUCTURAL = ("type", "properties", "required", "additionalProperties", "items", "enum",
                   "const")
JSON_CONSTRAINTS = ("format", "minLength", "maxLength", "pattern", "minimum", "maximum",
                    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems",
                    "maxItems", "uniqueItems", "minProperties", "maxProperties")
"""Compared for equality where the reader has them: a changed bound may refuse data."""
JSON_IGNORED = ("$schema", "$id", "$comment", "title", "description", "default", "examples",
                "deprecated", "readOnly", "writeOnly")


def check(level: str, new: Parsed, earlier: Sequence[Parsed]) -> list[str]:
    """What makes ``new`` incompatible with ``earlier`` (oldest first) under ``level``;
    empty: compatible."""
    if level == "NONE" or not earlier:
        return []
    against = earlier if level.endswith("_TRANSITIVE") else earlier[-1:]
    messages: list[str] = []
    for old in reversed(against):
        if level.startswith(("BACKWARD", "FULL")):
            messages += [f"{m} (the new schema reading data of an earlier one, {level})"
                         for m in readable(reader=new, writer=old)]
        if level.startswith(("FORWARD", "FULL")):
            messages += [f"{m} (an earlier schema reading the new one's data, {level})"
                         for m in readable(reader=old, writer=new)]
    return list(dict.fromkeys(messages))


def readable(reader: Parsed, writer: Parsed) -> list[str]:
    if reader.schema_type != writer.schema_type:
        return [f"the schema type changed from {writer.schema_type} to {reader.schema_type}"]
    if reader.schema_type == "AVRO":
        return _avro(reader, writer)
    if reader.schema_type == "PROTOBUF":
        return _protobuf(reader, writer)
    return _json(reader.value, writer.value, "#")


# -- Avro ----------------------------------------------------------------------------------


def _avro(reader: Parsed, writer: Parsed) -> list[str]:
    from avro.compatibility import (  # optional dep: [collector]
        ReaderWriterCompatibilityChecker,
        SchemaCompatibilityType,
    )

    # avro leaves the checker's __init__ unannotated
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(reader.value, writer.value)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted({k.value.upper() for k in result.incompatibilities}))
    where = ", ".join(sorted(result.locations))
    what = ", ".join(sorted(str(m) for m in result.messages))
    return [f"{kinds} at {where}: {what}"]


# -- Protobuf ------------------------------------------------------------------------------


def _messages(parsed: Parsed) -> dict[str, Any]:
    """Every message of the main file by full name, nested ones included."""
    out: dict[str, Any] = {}

    def walk(prefix: str, messages: Any) -> None:
        for message in messages:
            name = f"{prefix}.{message.name}" if prefix else message.name
            out[name] = message
            walk(name, message.nested_type)
    walk(parsed.value.package, parsed.value.message_type)
    return out


def _protobuf(reader: Parsed, writer: Parsed) -> list[str]:
    from google.protobuf import descriptor_pb2  # startup time

    types = descriptor_pb2.FieldDescriptorProto.Type
    labels = descriptor_pb2.FieldDescriptorProto.Label
    messages: list[str] = []
    written = _messages(writer)
    for name, message in _messages(reader).items():
        old = written.get(name)
        if old is None:
            continue
        by_number = {f.number: f for f in old.field}
        for field in message.field:
            was = by_number.get(field.number)
            if was is None:
                continue
            what = f"field {name}.{field.name} (number {field.number})"
            if was.type != field.type or was.type_name != field.type_name:
                messages.append(
                    f"{what}: its type changed from {types.Name(was.type).lower()[5:]}"
                    f"{' ' + was.type_name if was.type_name else ''} to "
                    f"{types.Name(field.type).lower()[5:]}"
                    f"{' ' + field.type_name if field.type_name else ''}")
            elif was.label != field.label:
                messages.append(f"{what}: its label changed from "
                                f"{labels.Name(was.label).lower()[6:]} to "
                                f"{labels.Name(field.label).lower()[6:]}")
    return messages


# -- JSON Schema ---------------------------------------------------------------------------


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _json(reader: Any, writer: Any, path: str) -> list[str]:
    if reader is True or reader == {}:
        return []
    if reader is False:
        return [] if writer is False else [f"{path}: the reader accepts nothing"]
    if writer is True or writer is False:
        writer = {} if writer is True else {"not": {}}
    messages = [f"{path}: keyword {key!r} is not checked by icefloe's JSON Schema "
                "compatibility checker; set this subject's compatibility to NONE to "
                "register it" for key in sorted(set(reader) | set(writer))
                if key not in (*JSON_STRUCTURAL, *JSON_CONSTRAINTS, *JSON_IGNORED)]
    if messages:
        return messages
    read_types, write_types = _types(reader), _types(writer)
    if read_types is not None:
        widened = read_types | ({"integer"} if "number" in read_types else set())
        if write_types is None or not write_types <= widened:
            return [f"{path}: the type changed from {sorted(write_types or ['any'])} to "
                    f"{sorted(read_types)}"]
    for key in JSON_CONSTRAINTS:
        if key in reader and reader.get(key) != writer.get(key):
            messages.append(f"{path}: {key} changed from {writer.get(key)!r} to "
                            f"{reader[key]!r} (constraints are compared for equality)")
    for key in ("enum", "const"):
        if key in reader and reader.get(key) != writer.get(key):
            values = reader[key] if key == "enum" else [reader[key]]
            old = writer.get("enum", [writer["const"]] if "const" in writer else None)
            if old is None or any(v not in values for v in old):
                messages.append(f"{path}: {key} narrowed")
    messages += _json_object(reader, writer, path)
    if "items" in reader and isinstance(reader["items"], dict | bool):
        messages += _json(reader["items"], writer.get("items", True), f"{path}/items")
    return messages


def _json_object(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    messages: list[str] = []
    read_props: dict[str, Any] = reader.get("properties", {})
    write_props: dict[str, Any] = writer.get("properties", {})
    newly = sorted(set(reader.get("required", [])) - set(writer.get("required", [])))
    messages += [f"{path}/properties/{name}: made required (data written without it is "
                 "refused)" for name in newly]
    for name, schema in read_props.items():
        if name in write_props:
            messages += _json(schema, write_props[name], f"{path}/properties/{name}")
        elif writer.get("additionalProperties", True) is not False:
            messages += [m for m in _json(schema, writer.get("additionalProperties", True),
                                          f"{path}/properties/{name}")]
    closed = reader.get("additionalProperties", True)
    opened = writer.get("additionalProperties", True)
    extra = sorted(set(write_props) - set(read_props))
    if closed is not True and opened != closed:
        messages.append(f"{path}: additionalProperties narrowed"
                        + (f" (the reader no longer accepts {', '.join(extra)})" if extra
                           else ""))
    elif closed is False and extra:
        messages.append(f"{path}: properties {', '.join(extra)} removed from a closed "
                        "object (additionalProperties false): data that has them is refused")
    return messages
