"""Parse and canonicalise schemas of the three types the registry serves.

Why canonical texts: a producer that registers the same schema with other whitespace or
attribute order must get the same id (Confluent's clients register on every start), so a
schema's identity is its canonical text, type and references, never its raw bytes.

- Avro: parsed by Apache ``avro`` (its own validation of names, types and defaults), the
  canonical text is the parsed schema's JSON (compact, the library's attribute order;
  defaults, docs and aliases kept: they matter to readers).
- Protobuf: ``.proto`` text compiled by protoc (``grpcio-tools``), or a base64
  ``FileDescriptorProto`` (what Confluent's Python serializer sends); the canonical text is
  the file's descriptor without its name and source info, serialised deterministically.
  Imports resolve to the schema's references, and to Protobuf's well-known types.
- JSON Schema: checked against its metaschema by ``jsonschema``; canonical: sorted keys.
"""

from __future__ import annotations

import base64
import binascii
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from icefloe.errors import SchemaRegistryError

ROOT_PROTO = "schema.proto"
"""The file name a Protobuf schema that is no one's reference compiles under."""


def invalid(message: str) -> SchemaRegistryError:
    return SchemaRegistryError(422, 42201, f"Invalid schema: {message}")


@dataclass(frozen=True)
class Parsed:
    """A schema as the checks need it. ``value``: the avro ``Schema``, the JSON Schema
    object, or (Protobuf) the main ``FileDescriptorProto``; ``files``: for Protobuf, every
    file it needs by import name (itself included)."""

    schema_type: str
    canonical: str
    value: Any
    files: Mapping[str, Any] = field(default_factory=dict)


def parse(schema_type: str, text: str, refs: Mapping[str, Parsed], name: str = ROOT_PROTO
          ) -> Parsed:
    """Parse ``text`` of ``schema_type`` with its references already parsed (by reference
    name). Raises :class:`SchemaRegistryError` 42201 naming what is wrong."""
    if schema_type == "AVRO":
        return _avro(text, refs)
    if schema_type == "PROTOBUF":
        return _protobuf(text, refs, name)
    if schema_type == "JSON":
        return _json_schema(text)
    raise invalid(f"unknown schemaType {schema_type!r}; one of AVRO, PROTOBUF, JSON")


# -- Avro ----------------------------------------------------------------------------------


def _avro(text: str, refs: Mapping[str, Parsed]) -> Parsed:
    import avro.errors  # optional dep: [collector]
    import avro.name  # optional dep
    import avro.schema  # optional dep

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise invalid(f"the Avro schema is not JSON: {exc}") from None
    names = avro.name.Names()
    try:
        for ref in refs.values():  # named types of other subjects, by their full names
            avro.schema.make_avsc_object(ref.value.to_json(), names)
        parsed = avro.schema.make_avsc_object(data, names)
    except (avro.errors.AvroException, TypeError, ValueError, KeyError,
            AttributeError) as exc:
        raise invalid(f"the Avro schema does not parse: {exc}") from None
    canonical = json.dumps(parsed.to_json(), separators=(",", ":"), ensure_ascii=False)
    return Parsed("AVRO", canonical, parsed)


# -- Protobuf ------------------------------------------------------------------------------


def _protobuf(text: str, refs: Mapping[str, Parsed], name: str) -> Parsed:
    from google.protobuf import descriptor_pb2  # startup time

    deps: dict[str, Any] = {}
    for ref in refs.values():
        deps.update(ref.files)
    main = _decoded(text)
    if main is None:
        main = _compiled(text, name, deps)
    main.name = name
    files = {**deps, name: main}
    _check_links(main, files)
    canonical = descriptor_pb2.FileDescriptorProto()
    canonical.CopyFrom(main)
    canonical.ClearField("name")
    canonical.ClearField("source_code_info")
    encoded = base64.standard_b64encode(canonical.SerializeToString(deterministic=True))
    return Parsed("PROTOBUF", encoded.decode("ascii"), main, files)


def _decoded(text: str) -> Any:
    """A base64 ``FileDescriptorProto`` (Confluent's serialized form), or None for text."""
    from google.protobuf import descriptor_pb2  # startup time
    from google.protobuf.message import DecodeError  # startup time

    stripped = text.strip()
    if not stripped or any(c.isspace() for c in stripped) or ";" in stripped:
        return None
    try:
        raw = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(raw)
    except DecodeError as exc:
        raise invalid(f"the base64 Protobuf descriptor does not decode: {exc}") from None
    return proto


def _well_known_dir() -> Path:
    return Path(str(resources.files("grpc_tools") / "_proto"))


def _compiled(text: str, name: str, deps: Mapping[str, Any]) -> Any:
    """Compile ``.proto`` text with protoc (in a child process: protoc's messages go to its
    stderr, which becomes the 42201 message)."""
    from google.protobuf import descriptor_pb2  # startup time

    with tempfile.TemporaryDirectory(prefix="icefloe-proto-") as tmp:
        root = Path(tmp)
        source = root / "src" / name
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text, encoding="utf-8")
        args = [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={root / 'src'}",
                f"--proto_path={_well_known_dir()}", "--include_imports",
                f"--descriptor_set_out={root / 'out.binpb'}"]
        if deps:
            given = descriptor_pb2.FileDescriptorSet()
            given.file.extend(ordered_files(deps))
            (root / "in.binpb").write_bytes(given.SerializeToString())
            args.append(f"--descriptor_set_in={root / 'in.binpb'}")
        result = subprocess.run([*args, name], capture_output=True, text=True,
                                timeout=60, check=False)
        if result.returncode != 0:
            reason = " ".join(result.stderr.replace(str(root / "src") + "/", "").split())
            raise invalid(f"the Protobuf schema does not compile: {reason or 'protoc failed'}")
        out = descriptor_pb2.FileDescriptorSet()
        out.ParseFromString((root / "out.binpb").read_bytes())
    for file in out.file:
        if file.name == name:
            return file
    raise invalid(f"protoc produced no descriptor for {name}")


def ordered_files(files: Mapping[str, Any]) -> list[Any]:
    """Files (``FileDescriptorProto`` by import name) with every dependency before its
    dependents: the order a descriptor pool accepts them in."""
    out: list[Any] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in files:
            return
        seen.add(name)
        for dep in files[name].dependency:
            visit(dep)
        out.append(files[name])
    for name in files:
        visit(name)
    return out


def load_well_known() -> None:
    """Importing the well-known types' modules puts their files into the default pool."""
    from google.protobuf import (  # noqa: F401
        any_pb2,
        api_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )


def well_known_file(name: str) -> Any:
    """The ``FileDescriptorProto`` of a well-known type's file
    (``google/protobuf/timestamp.proto``...), or None for any other name. Why here: a
    producer's descriptor names these imports without shipping them (protoc's
    ``--include_imports`` does, a registry schema's references do not)."""
    from google.protobuf import descriptor_pb2, descriptor_pool  # startup time

    if not name.startswith("google/protobuf/"):
        return None
    load_well_known()
    try:
        found = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def _check_links(main: Any, files: dict[str, Any]) -> None:
    """Build the file in a fresh descriptor pool: every import must be a reference or a
    well-known type, and every type name must resolve (protoc checked text already; a
    base64 descriptor is checked only here)."""
    from google.protobuf import descriptor_pool  # startup time

    pending = [main]
    while pending:  # every import first (a pool built after each would miss the next)
        for dep in pending.pop().dependency:
            if dep in files:
                continue
            proto = well_known_file(dep)
            if proto is None:
                raise invalid(f"import {dep!r} is neither a reference of this schema nor "
                              "a well-known type; register it and name it in `references`")
            files[dep] = proto
            pending.append(proto)
    pool = descriptor_pool.DescriptorPool()
    try:
        for file in ordered_files(files):
            pool.Add(file)
        pool.FindFileByName(main.name)
    except Exception as exc:  # the pool's errors differ by implementation (upb, C++)
        raise invalid(f"the Protobuf descriptor does not build: {exc}") from None


# -- JSON Schema ---------------------------------------------------------------------------


def _json_schema(text: str) -> Parsed:
    import jsonschema  # optional dep: [collector]
    import jsonschema.exceptions  # optional dep

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise invalid(f"the JSON Schema is not JSON: {exc}") from None
    if not isinstance(data, dict | bool):
        raise invalid("a JSON Schema is an object or a boolean")
    try:
        if isinstance(data, dict):  # true and false are schemas, and always valid ones
            jsonschema.validators.validator_for(data).check_schema(data)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise invalid(f"the JSON Schema breaks its metaschema at {where}: "
                      f"{exc.message}") from None
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Parsed("JSON", canonical, data)


def serialized(parsed: Parsed) -> str:
    """The ``?format=serialized`` form: a Protobuf schema as a base64 descriptor (what
    Confluent's deserializers ask for); other types as their canonical text."""
    if parsed.schema_type != "PROTOBUF":
        return parsed.canonical
    return base64.standard_b64encode(parsed.value.SerializeToString()).decode("ascii")
