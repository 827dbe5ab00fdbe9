"""A Protobuf message as a stream's type: its columns, its payload checks, its evolution.

Why this module: a ``format = "protobuf"`` stream takes its columns from a message, so the
ingestor (:meth:`ProtobufType.check`, :meth:`ProtobufType.from_json`), the collector (the
Arrow decoder in ``pipeline/load/protobuf_arrow.py`` reads :meth:`ProtobufType.columns`)
and the admin API (:meth:`ProtobufType.incompatibilities`, :meth:`ProtobufType.renames`)
must all read the same mapping. It needs only ``protobuf`` (a core dependency): the light
ingestor image checks payloads without pyarrow.

The mapping (``docs/protobuf.md`` has the table): scalars as their nearest icefloe type
(``uint32`` → ``long``, ``uint64``/``fixed64`` → ``decimal(20,0)`` so no value wraps),
enums as their value's name (or ``int``), messages as ``struct``, ``repeated`` as
``list``, maps as ``map<string, V>`` with the keys' canonical JSON text, ``oneof`` members
as ordinary nullable columns, and the well-known types natively (``Timestamp`` →
``timestamp``, ``Duration`` → ``long`` microseconds, wrappers → nullable scalars,
``Struct``/``Value``/``ListValue`` → ``json``, ``Any`` → ``struct<type_url, value>``).
Columns come in declaration order, and carry their field numbers.

Field numbers and Iceberg field ids: Iceberg ids are unique per table and assigned by the
catalog when a column is added, so they cannot be the field numbers (a nested message's
field 1 and the top-level field 1 would clash). icefloe keeps a column for a field by the
field's *number path* instead — ``"3"`` for top-level field 3, ``"3.2"`` for field 2 of
the message in field 3 (a list is transparent, a map's value is its entry's field 2:
``"5.2.1"``). Column paths are dotted field names (``customer.address``; a list's or a
map's message fields: ``lines.sku``). :meth:`ProtobufType.number_paths` gives number
path → column path; a table that stores it (a table property) finds a renamed field at
any depth by its number path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Final, Literal

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    unknown_fields,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

from icefloe.schemas.formats import ordered_files, well_known_file
from icefloe.streams.typespec import MAX_TYPE_DEPTH
from icefloe.typed.codec import TypeChangeError, TypedColumn, TypedPayloadError

if TYPE_CHECKING:
    from google.protobuf.descriptor_pb2 import FileDescriptorProto

EnumMode = Literal["string", "int"]

_F = FieldDescriptor
_SCALARS: Final[dict[int, tuple[str, str]]] = {
    # protobuf type -> (its .proto name, the icefloe column type)
    _F.TYPE_INT32: ("int32", "int"), _F.TYPE_SINT32: ("sint32", "int"),
    _F.TYPE_SFIXED32: ("sfixed32", "int"), _F.TYPE_INT64: ("int64", "long"),
    _F.TYPE_SINT64: ("sint64", "long"), _F.TYPE_SFIXED64: ("sfixed64", "long"),
    _F.TYPE_UINT32: ("uint32", "long"), _F.TYPE_FIXED32: ("fixed32", "long"),
    _F.TYPE_UINT64: ("uint64", "decimal(20,0)"), _F.TYPE_FIXED64: ("fixed64", "decimal(20,0)"),
    _F.TYPE_FLOAT: ("float", "float"), _F.TYPE_DOUBLE: ("double", "double"),
    _F.TYPE_BOOL: ("bool", "boolean"), _F.TYPE_STRING: ("string", "string"),
    _F.TYPE_BYTES: ("bytes", "binary"),
}
_WIRE_GROUP: Final[dict[str, str]] = {
    # types whose encodings Protobuf lets a field switch between (same group); a switch
    # across groups makes old payloads decode to other values or to nothing
    # across groups makes old payloads decode to other values or to nothing. Signed and
    # unsigned are groups of their own: Protobuf lets int32 become uint32, but a negative
    # value then reads as a number near 2**32 (or 2**64), and bool reads any other number
    # as true
    "int32": "varint", "int64": "varint", "enum": "varint", "uint32": "uvarint",
    "uint64": "uvarint", "bool": "bool", "sint32": "zigzag", "sint64": "zigzag",
    "fixed32": "u32", "sfixed32": "s32", "float": "float", "fixed64": "u64",
    "sfixed64": "s64", "double": "double", "string": "text", "bytes": "text",
}
_WELL_KNOWN: Final[dict[str, str]] = {
    "google.protobuf.Timestamp": "timestamp",
    "google.protobuf.Duration": "long",
    "google.protobuf.DoubleValue": "double", "google.protobuf.FloatValue": "float",
    "google.protobuf.Int64Value": "long", "google.protobuf.UInt64Value": "decimal(20,0)",
    "google.protobuf.Int32Value": "int", "google.protobuf.UInt32Value": "long",
    "google.protobuf.BoolValue": "boolean", "google.protobuf.StringValue": "string",
    "google.protobuf.BytesValue": "binary",
    "google.protobuf.Struct": "json", "google.protobuf.Value": "json",
    "google.protobuf.ListValue": "json",
    "google.protobuf.Any": "struct<type_url: string, value: binary>",
}
"""Well-known message types with a native column type (by full name)."""
_DOCS: Final[dict[str, str]] = {
    "google.protobuf.Duration": "google.protobuf.Duration as microseconds",
    "google.protobuf.Any": "google.protobuf.Any: the packed message's type URL and bytes",
}
_PROMOTIONS: Final = {("int", "long"), ("float", "double")}
"""Column type changes Iceberg applies in place (besides a wider decimal)."""
_EXAMPLES: Final = 5
"""How many existing message names an unknown-message error lists."""


class DescriptorError(ValueError):
    """A descriptor (set) that cannot give a stream its type: it does not parse, a file
    misses an import, the message is unknown, recursive, or nests too deep. The message
    names the file, import, message or field path."""


@dataclass(frozen=True, slots=True)
class _Node:
    """One message field as a column: ``type`` is its icefloe type string; ``proto`` the
    .proto type it has (``int32``, ``enum acme.Color``, ``acme.Inner``...), ``label``
    ``""``, ``"repeated"`` or ``"map"``; ``children`` the fields of the message it holds
    (in a list, or as a map's value), ``step`` the number-path step to them (``""``, or
    ``".2"`` through a map entry) and ``segment`` the column-path segment
    (``""``, ``".element"``, ``".value"``)."""

    name: str
    number: int
    type: str
    proto: str
    label: str
    required: bool
    doc: str
    children: tuple[_Node, ...]
    step: str
    segment: str

    def leaf_type(self) -> str:
        """The column type without its list/map around it."""
        kind = self.type
        if self.label == "repeated":
            return kind[len("list<"):-1]
        if self.label == "map":
            return kind[len("map<string,"):-1]
        return kind


_WRAPPERS = frozenset(f"google.protobuf.{kind}Value" for kind in (
    "Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes"))
"""Well-known wrapper messages: a field of one holds a scalar with presence."""


class ProtobufType:
    """One Protobuf message (by full name) in its own descriptor pool, as a stream type.

    Build it with :meth:`from_descriptor_set` (a serialized ``FileDescriptorSet``: a buf
    image, protoc's ``--descriptor_set_out``) or :meth:`from_files` (the schema registry's
    ``FileDescriptorProto``\\ s). Raises :class:`DescriptorError` when it cannot. Pickles
    (by its descriptor set) so a Spark task can receive it.
    """

    def __init__(self, files: Sequence[FileDescriptorProto], message: str, *,
                 enums: EnumMode = "string", origin: str = "") -> None:
        if enums not in ("string", "int"):
            raise ValueError(f"enums is 'string' or 'int', not {enums!r}")
        self.enums: EnumMode = enums
        self.origin = origin or "the descriptor set"
        self._files = _complete(files, self.origin)
        pool = descriptor_pool.DescriptorPool()
        try:
            for file in self._files:
                pool.Add(file)
        except Exception as exc:  # the pool's errors differ by implementation (upb, C++)
            raise DescriptorError(f"{self.origin} does not build: {exc}") from None
        self._pool = pool
        self.descriptor: Descriptor = _find_message(pool, self._files, message.lstrip("."),
                                                    self.origin)
        self.full_name: str = self.descriptor.full_name
        self._class: type[Message] = message_factory.GetMessageClass(self.descriptor)
        self._checked_utf8 = frozenset(f.name for f in self._files
                                       if f.syntax in ("proto3", "editions"))
        self._nodes = _fields(self.descriptor, enums, (self.full_name,), "", 0)
        self._has_required = _has_required(self.descriptor, set())

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_descriptor_set(cls, data: bytes, message: str, *, enums: EnumMode = "string",
                            origin: str = "") -> ProtobufType:
        """``message`` of a serialized ``FileDescriptorSet`` (``buf build -o
        image.binpb``; ``protoc --include_imports --descriptor_set_out``). Imports of
        well-known types resolve even when the set does not hold them."""
        where = origin or "the descriptor set"
        parsed = descriptor_pb2.FileDescriptorSet()
        try:
            parsed.ParseFromString(data)
        except DecodeError as exc:
            raise DescriptorError(f"{where} does not parse as a FileDescriptorSet (what "
                                  f"`buf build -o` and `protoc --descriptor_set_out` "
                                  f"write): {exc}") from None
        if not parsed.file:
            raise DescriptorError(f"{where} holds no file")
        return cls(list(parsed.file), message, enums=enums, origin=origin)

    @classmethod
    def from_files(cls, files: Sequence[FileDescriptorProto], message: str, *,
                   enums: EnumMode = "string", origin: str = "") -> ProtobufType:
        """``message`` of these files (any order; the registry's ``Parsed.files``)."""
        return cls(files, message, enums=enums, origin=origin)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.descriptor_set(), self.full_name, self.enums, self.origin))

    def __repr__(self) -> str:
        return f"ProtobufType({self.full_name!r}, enums={self.enums!r})"

    # -- what the stream is --------------------------------------------------------------

    @property
    def files(self) -> tuple[FileDescriptorProto, ...]:
        """Every file the message needs, dependencies first (well-known types included)."""
        return tuple(self._files)

    def descriptor_set(self) -> bytes:
        """The files as one serialized ``FileDescriptorSet`` (deterministic bytes: what to
        store, and what :meth:`from_descriptor_set` reads back)."""
        out = descriptor_pb2.FileDescriptorSet()
        out.file.extend(self._files)
        return out.SerializeToString(deterministic=True)

    @property
    def message_class(self) -> type[Message]:
        return self._class

    def columns(self) -> tuple[TypedColumn, ...]:
        """The top-level fields as columns, in declaration order (the order of the
        ``.proto``), each with its field number; ``required`` only for proto2 ``required``."""
        return tuple(TypedColumn(n.name, n.type, n.required, n.doc, n.number)
                     for n in self._nodes)

    def number_paths(self) -> dict[str, str]:
        """Number path → column path of every field at every depth: ``{"3": "customer",
        "3.2": "customer.address", "7.1": "items.sku", "9.2.1": "labels.text"}``. Column
        paths are the fields' names, dotted; a list's element and a map's value add no
        name (Iceberg's ``element``/``value`` steps are implied, as
        ``pipeline.iceberg.field_numbers.iceberg_path`` reads them)."""
        return {number: path for number, path, _ in _walk(self._nodes, "", "")}

    def number_types(self) -> dict[str, str]:
        """Number path → the field's value type as the ``.proto`` writes it (``int32``,
        ``sint64``, ``enum acme.Color``, ``map<string, int32>``, a message's full name):
        what a table remembers to refuse a later encoding change its column types do not
        show (``int32`` → ``sint32`` keeps an ``int`` column; see
        :func:`encoding_change`)."""
        return {number: node.proto for number, _, node in _walk(self._nodes, "", "")}

    def json_fields(self) -> dict[str, str]:
        """Value path → well-known type full name of every ``json`` value (``Struct``,
        ``Value``, ``ListValue``), at any depth: what the Arrow decoder turns into JSON
        text. A list's values are at ``path.element``, a map's at ``path.value``."""
        out: dict[str, str] = {}
        for _, path, node in _walk(self._nodes, "", "", arrow=True):
            if node.leaf_type() == "json":
                out[path + node.segment] = _bare(node.proto)
        return out

    # -- payloads ------------------------------------------------------------------------

    def check(self, payload: bytes) -> None:
        """Raise :class:`TypedPayloadError` unless ``payload`` is this message's binary
        encoding: truncated or corrupt bytes, invalid UTF-8 in a string field, a proto2
        ``required`` field missing, a known field number with another wire type. Fields
        this type does not know are accepted (a newer producer's)."""
        parsed = self._class()
        try:
            parsed.ParseFromString(payload)
        except DecodeError as exc:
            raise self._explain(payload, str(exc)) from None
        if self._has_required and not parsed.IsInitialized():
            missing = _missing(parsed)
            raise TypedPayloadError(f"{self.full_name}: required field(s) missing: {missing}",
                                    field=missing.split(", ")[0])
        size = parsed.ByteSize()
        parsed.DiscardUnknownFields()
        if parsed.ByteSize() == size:  # no unknown field at any depth: the common case
            return
        parsed = self._class.FromString(payload)  # a newer producer's fields, or ...
        found = _misplaced(parsed)
        if found is not None:  # ... a known number upb kept as unknown
            field, value, wire = found
            if wire == 0 and field.enum_type is not None and field.enum_type.is_closed:
                raise TypedPayloadError(
                    f"{self.full_name}: field {field.name} holds {value}, which is not a "
                    f"value of the closed (proto2) enum {field.enum_type.full_name}: proto2 "
                    "drops unknown values of a closed enum, so it cannot be stored; add the "
                    "value to the enum in the stream's descriptor (or make the enum open: "
                    "proto3, or editions' enum_type = OPEN)", field=field.name)
            # ... else a value sent with another wire type
            problem = _WireCheck(payload, self._checked_utf8).problem(self.descriptor)
            raise problem or TypedPayloadError(
                f"{self.full_name}: a field has another wire type than its declared type")

    def check_many(self, payloads: Sequence[bytes]) -> bool:
        """Whether every payload passes :meth:`check`, found in one parse of all of them
        (as the repeated field of a wrapper message: one C call instead of five per
        message, the ingestor's hot path). False says only that some payload does not:
        :meth:`check` each one then to find which, and why."""
        if not payloads:
            return True
        if not all(payloads):  # an empty payload is no message (check refuses it too)
            return False
        wrapper = self._batch_class()()
        try:
            wrapper.ParseFromString(_framed(payloads))
        except DecodeError:
            return False
        if len(wrapper.items) != len(payloads):  # type: ignore[attr-defined]  # (made at run time)
            return False
        if self._has_required and not wrapper.IsInitialized():
            return False
        size = wrapper.ByteSize()
        wrapper.DiscardUnknownFields()
        return wrapper.ByteSize() == size  # unknown fields: check each (wire types)

    def field_texts(self, payloads: Sequence[bytes], name: str) -> list[str | None]:
        """Top-level field ``name`` of each (checked) payload as text, None where it is not
        set: a stream's event ids. Not set: a field with presence left out, an empty
        string, and a field without presence (proto3's plain scalars) holding its default
        (0: proto3 cannot tell it from unset, and every such event would share the id
        "0"). A wrapper type (``google.protobuf.StringValue``...) gives its ``value``, an
        enum its value's name as its column holds it (``enums = "string"``). One parse for
        all of them, as :meth:`check_many`."""
        wrapper = self._batch_class()()
        wrapper.ParseFromString(_framed(payloads))
        field = self.descriptor.fields_by_name[name]
        present = field.has_presence
        wrapped = field.message_type is not None \
            and field.message_type.full_name in _WRAPPERS
        enum = field.enum_type if self.enums == "string" else None
        out: list[str | None] = []
        for item in wrapper.items:  # type: ignore[attr-defined]  # (made at run time)
            if present and not item.HasField(name):
                out.append(None)
                continue
            value = getattr(item, name)
            if wrapped:
                value = value.value
            if value == "" or (not present and value == 0):
                out.append(None)
            elif enum is not None and value in enum.values_by_number:
                out.append(enum.values_by_number[value].name)
            else:
                out.append(str(value))
        return out

    def _batch_class(self) -> type[Message]:
        """``message Batch { repeated <this message> items = 1; }`` in this type's pool."""
        found = self.__dict__.get("_batch")
        if found is not None:
            return found  # type: ignore[no-any-return]
        name = "Batch_" + re.sub(r"\W", "_", self.full_name)
        file = descriptor_pb2.FileDescriptorProto(
            name=f"icefloe/batch/{self.full_name}.proto", package="icefloe.batch",
            syntax="proto3", dependency=[self.descriptor.file.name],
            message_type=[descriptor_pb2.DescriptorProto(name=name, field=[
                descriptor_pb2.FieldDescriptorProto(
                    name="items", number=1,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                    type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                    type_name="." + self.full_name)])])
        self._pool.Add(file)
        made: type[Message] = message_factory.GetMessageClass(
            self._pool.FindMessageTypeByName(f"icefloe.batch.{name}"))
        self.__dict__["_batch"] = made
        return made

    def parse(self, payload: bytes) -> Message:
        """The payload as a message (after :meth:`check`'s refusals)."""
        self.check(payload)
        return self._class.FromString(payload)

    def from_json(self, body: bytes | str) -> bytes:
        """Protobuf's canonical JSON of one message → its binary encoding. Unknown fields
        are refused (JSON has no numbers to keep them by). Raises
        :class:`TypedPayloadError` naming the field."""
        target = self._class()
        try:
            json_format.Parse(body, target, ignore_unknown_fields=False)
        except json_format.ParseError as exc:
            text = " ".join(str(exc).split())
            raise TypedPayloadError(f"{self.full_name}: {text}",
                                    field=_json_error_field(text)) from None
        except (ValueError, TypeError) as exc:  # not UTF-8, not JSON at all
            raise TypedPayloadError(f"{self.full_name}: the body is not JSON: {exc}"
                                    ) from None
        try:
            return target.SerializeToString()
        except EncodeError:
            missing = _missing(target)
            raise TypedPayloadError(f"{self.full_name}: required field(s) missing: {missing}",
                                    field=missing.split(", ")[0]) from None

    def to_json(self, payload: bytes) -> bytes:
        """A checked payload as Protobuf's canonical JSON (field names as in the .proto)."""
        data = json_format.MessageToDict(self.parse(payload), preserving_proto_field_name=True)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    def _explain(self, payload: bytes, reason: str) -> TypedPayloadError:
        problem = _WireCheck(payload, self._checked_utf8).problem(self.descriptor)
        if problem is not None:
            return problem
        return TypedPayloadError(f"{self.full_name}: the payload does not parse ({reason}); "
                                 "the decoder does not say which field")

    # -- evolution -----------------------------------------------------------------------

    def renames(self, earlier: ProtobufType) -> list[tuple[str, str]]:
        """``(old column path, new column path)`` of every field, at any depth, whose
        number path is in both types but whose own name changed; parents first. The old
        paths are the earlier type's (what an Iceberg rename in one update names)."""
        before = {number: (path, node) for number, path, node in
                  _walk(earlier._nodes, "", "")}
        out: list[tuple[str, str]] = []
        for number, path, node in _walk(self._nodes, "", ""):
            old = before.get(number)
            if old is not None and old[1].name != node.name and _compatible(old[1], node):
                out.append((old[0], path))
        return out

    def renames_from(self, paths: Mapping[str, str]) -> list[tuple[str, str]]:
        """:meth:`renames` against a stored :meth:`number_paths` map (a table property):
        the table may have last seen any earlier version, not only the previous one."""
        out: list[tuple[str, str]] = []
        for number, path in self.number_paths().items():
            old = paths.get(number)
            if old is not None and old.rsplit(".", 1)[-1] != path.rsplit(".", 1)[-1]:
                out.append((old, path))
        return out

    def incompatibilities(self, earlier: ProtobufType) -> list[str]:
        """Why the table of ``earlier`` cannot follow this type, one message per field
        number reused with another type or cardinality, at any depth; empty when it can
        (new fields add columns, removed ones stay as nullable columns)."""
        before = {number: (path, node) for number, path, node in
                  _walk(earlier._nodes, "", "")}
        out: list[str] = []
        for number, path, node in _walk(self._nodes, "", ""):
            old = before.get(number)
            if old is None or _compatible(old[1], node):
                continue
            was = old[0] if old[0] == path else f"{old[0]}, now {path}"
            out.append(f"field {was} (number {number}) was {_describe(old[1])}, now "
                       f"{_describe(node)}: {_why(old[1], node)}")
        return out

    def require_compatible(self, earlier: ProtobufType) -> None:
        """Raise :class:`TypeChangeError` listing :meth:`incompatibilities`, if any."""
        problems = self.incompatibilities(earlier)
        if problems:
            raise TypeChangeError(f"{self.full_name} cannot replace its earlier version: "
                                  + "; ".join(problems))


def _misplaced(message: Message) -> tuple[Any, Any, int] | None:
    """The first field of ``message`` (or of one it holds) that keeps an unknown value under
    a number its type declares, with that value and its wire type: how upb stores a value
    sent with another wire type, or a proto2 closed enum's value the enum lacks. None when
    there is none:
    unknown fields under other numbers are a newer producer's, and fine. Why not walk the
    bytes: only the message fields that are set are visited, through upb (a few
    microseconds a payload)."""
    unknown = unknown_fields.UnknownFieldSet(message)
    descriptor: Any = message.DESCRIPTOR  # the stubs: a union of the upb and Python types
    if len(unknown):
        known = descriptor.fields_by_number
        for i in range(len(unknown)):
            if unknown[i].field_number in known:
                return (known[unknown[i].field_number], unknown[i].data,
                        unknown[i].wire_type)
    for name, shape in _message_fields(descriptor):
        if shape == _SINGULAR:
            found = _misplaced(getattr(message, name)) if message.HasField(name) else None
            if found is not None:
                return found
        else:
            values = getattr(message, name)
            for value in (values.values() if shape == _MAP else values):
                found = _misplaced(value)
                if found is not None:
                    return found
    return None


_SINGULAR, _REPEATED, _MAP = 0, 1, 2
_PLANS: dict[Descriptor, tuple[tuple[str, int], ...]] = {}
"""By descriptor object, not name: two versions of one message are two descriptors."""


def _message_fields(message: Descriptor) -> tuple[tuple[str, int], ...]:
    """The fields of ``message`` that hold messages, with their shape (cached by type)."""
    plan = _PLANS.get(message)
    if plan is None:
        out: list[tuple[str, int]] = []
        for field in message.fields:
            inner = field.message_type
            if inner is None:
                continue
            if inner.GetOptions().map_entry:
                if inner.fields_by_number[2].message_type is not None:
                    out.append((field.name, _MAP))
            else:
                out.append((field.name, _REPEATED if field.is_repeated else _SINGULAR))
        plan = _PLANS[message] = tuple(out)
    return plan


def _missing(message: Message) -> str:
    """The required fields a message misses, as dotted paths (upb and C++ both have
    ``FindInitializationErrors``; the stubs do not)."""
    errors: list[str] = getattr(message, "FindInitializationErrors")()  # noqa: B009
    return ", ".join(errors)


def _rebuild(data: bytes, message: str, enums: EnumMode, origin: str) -> ProtobufType:
    return ProtobufType.from_descriptor_set(data, message, enums=enums, origin=origin)


# -- descriptors ---------------------------------------------------------------------------


def _complete(files: Sequence[FileDescriptorProto], origin: str) -> list[FileDescriptorProto]:
    """The files in pool order, with the well-known types they import added. Raises
    :class:`DescriptorError` naming a file and the import it misses."""
    by_name: dict[str, FileDescriptorProto] = {}
    for file in files:
        by_name.setdefault(file.name, file)
    pending = list(by_name.values())
    while pending:
        file = pending.pop()
        for dep in file.dependency:
            if dep in by_name:
                continue
            known = well_known_file(dep)
            if known is None:
                raise DescriptorError(
                    f"{origin}: {file.name!r} imports {dep!r}, which it does not hold "
                    "(protoc writes imports only with --include_imports; buf build "
                    "includes them unless --exclude-imports)")
            by_name[dep] = known
            pending.append(known)
    return list(ordered_files(by_name))


def _find_message(pool: Any, files: Sequence[FileDescriptorProto], name: str,
                  origin: str) -> Descriptor:
    try:
        found: Descriptor = pool.FindMessageTypeByName(name)
        return found
    except KeyError:
        pass
    names = [n for f in files if not f.name.startswith("google/protobuf/")
             for n in _message_names(f.package, f.message_type)]
    listed = ", ".join(names[:_EXAMPLES]) + (", ..." if len(names) > _EXAMPLES else "")
    raise DescriptorError(f"{origin} has no message {name!r} (a full name, package "
                          f"included); it has: {listed or 'no message at all'}")


def _message_names(scope: str, messages: Any) -> Iterator[str]:
    for message in messages:
        full = f"{scope}.{message.name}" if scope else message.name
        if not message.options.map_entry:
            yield full
        yield from _message_names(full, message.nested_type)


def _fields(message: Descriptor, enums: EnumMode, stack: tuple[str, ...], path: str,
            depth: int) -> tuple[_Node, ...]:
    """The message's fields as nodes (fields of an empty message type get none)."""
    nodes = (_node(f, enums, stack, path, depth) for f in message.fields)
    return tuple(n for n in nodes if n is not None)


def _node(field: FieldDescriptor, enums: EnumMode, stack: tuple[str, ...], path: str,
          depth: int) -> _Node | None:
    where = f"{path}{field.name}"
    entry = field.message_type
    if field.is_repeated:
        _check_depth(stack[0], where, depth)
    if field.is_repeated and entry is not None and entry.GetOptions().map_entry:
        value = entry.fields_by_number[2]
        leaf = _leaf(value, enums, stack, where + ".", depth + 1)
        if leaf is None:
            return None
        kind, proto, doc, children = leaf
        return _Node(field.name, field.number, f"map<string,{kind}>",
                     f"map<{_proto_name(entry.fields_by_number[1])}, {proto}>",
                     "map", False, doc, children, ".2", ".value")
    leaf = _leaf(field, enums, stack, where + ".", depth + (1 if field.is_repeated else 0))
    if leaf is None:
        return None
    kind, proto, doc, children = leaf
    if field.is_repeated:
        return _Node(field.name, field.number, f"list<{kind}>", proto, "repeated", False,
                     doc, children, "", ".element")
    return _Node(field.name, field.number, kind, proto, "", field.is_required, doc,
                 children, "", "")


def _leaf(field: FieldDescriptor, enums: EnumMode, stack: tuple[str, ...], path: str,
          depth: int) -> tuple[str, str, str, tuple[_Node, ...]] | None:
    """(column type, .proto type, doc, children) of one value of ``field``."""
    if field.type == _F.TYPE_ENUM:
        return ("string" if enums == "string" else "int", _proto_name(field), "", ())
    message = field.message_type
    if message is None:
        proto, kind = _SCALARS[field.type]
        return kind, proto, "", ()
    name = message.full_name
    if name in _WELL_KNOWN:
        return _WELL_KNOWN[name], name, _DOCS.get(name, ""), ()
    where = path.rstrip(".")
    if name in stack:
        raise DescriptorError(
            f"{stack[0]}: field {where} holds {name}, which contains itself; a table "
            "cannot hold a type of unbounded depth (wrap the recursive part in "
            "google.protobuf.Struct or bytes)")
    _check_depth(stack[0], where, depth)
    children = _fields(message, enums, (*stack, name), path, depth + 1)
    if not children:
        return None
    inner = ", ".join(f"{c.name}: {c.type}" for c in children)
    return f"struct<{inner}>", name, "", children


def _has_required(message: Descriptor, seen: set[str]) -> bool:
    """Whether a proto2 ``required`` field is anywhere in the message (else a parsed
    payload needs no initialization check)."""
    seen.add(message.full_name)
    for field in message.fields:
        if field.is_required:
            return True
        inner = field.message_type
        if inner is not None and inner.full_name not in seen and _has_required(inner, seen):
            return True
    return False


def _check_depth(message: str, where: str, depth: int) -> None:
    """``depth``: how many list/map/struct levels hold the value about to nest one more."""
    if depth >= MAX_TYPE_DEPTH:
        raise DescriptorError(f"{message}: field {where} nests deeper than "
                              f"{MAX_TYPE_DEPTH} levels, the most a column type may")


def _proto_name(field: FieldDescriptor) -> str:
    """The field's value type as the .proto names it (``enum acme.Color`` for enums)."""
    if field.enum_type is not None:
        return f"enum {field.enum_type.full_name}"
    if field.message_type is not None:
        return str(field.message_type.full_name)
    return _SCALARS[field.type][0]


def _walk(nodes: Sequence[_Node], numbers: str, path: str, *, arrow: bool = False
          ) -> Iterator[tuple[str, str, _Node]]:
    """(number path, column path, node) of every node, parents first. Column paths are
    dotted names (``lines.sku``); with ``arrow`` they also name the steps into a list's
    ``element`` and a map's ``value`` (``lines.element.sku``), as the Arrow decoder walks."""
    for node in nodes:
        number = f"{numbers}{node.number}"
        column = f"{path}{node.name}"
        yield number, column, node
        yield from _walk(node.children, number + node.step + ".",
                         column + (node.segment if arrow else "") + ".", arrow=arrow)


# -- evolution -----------------------------------------------------------------------------


def _compatible(old: _Node, new: _Node) -> bool:
    return not _why(old, new)


def _why(old: _Node, new: _Node) -> str:
    """Why ``new`` cannot follow ``old`` in one column, or "" when it can."""
    if old.label != new.label:
        return "a field cannot change between singular, repeated and map"
    before, after = old.leaf_type(), new.leaf_type()
    if before.startswith("struct<") and after.startswith("struct<"):
        return ""  # their fields are compared by number, each on its own
    if not _promotable(before, after):
        return f"the column's type cannot change from {before} to {after}"
    return encoding_change(old.proto, new.proto)


def _promotable(before: str, after: str) -> bool:
    if before == after or (before, after) in _PROMOTIONS:
        return True
    wide = re.fullmatch(r"decimal\((\d+),(\d+)\)", before), re.fullmatch(
        r"decimal\((\d+),(\d+)\)", after)
    return bool(wide[0] and wide[1] and wide[0][2] == wide[1][2]
                and int(wide[1][1]) >= int(wide[0][1]))


def _bare(proto: str) -> str:
    """The value type of a ``.proto`` type description (a map's value)."""
    return proto.split(", ")[-1].rstrip(">") if proto.startswith("map<") else proto


def encoding_change(old: str, new: str) -> str:
    """Why payloads written with a field of ``.proto`` type ``old`` would not read as the
    same values through ``new`` (see :meth:`ProtobufType.number_types`), or "" when they
    would: another wire encoding (``int32`` and ``sint32``, ``float`` and ``double``),
    another signedness (``int32`` and ``uint32``), or another map key type. A message
    type on either side is not judged here: its fields are, by their own numbers, and a
    message becoming a scalar changes the column's type."""
    if old.startswith("map<") and new.startswith("map<") \
            and old.split(",")[0] != new.split(",")[0]:
        return "a map's key type cannot change"
    groups = set(_WIRE_GROUP.values())
    if _wire_group(old) not in groups or _wire_group(new) not in groups:
        return ""
    if _wire_group(old) != _wire_group(new):
        return ("Protobuf decodes the old encoding as another value or not at all "
                f"({_bare(old)} and {_bare(new)} are not wire-compatible)")
    return ""


def _wire_group(proto: str) -> str:
    bare = _bare(proto)
    if bare.startswith("enum "):
        return "varint"
    return _WIRE_GROUP.get(bare, bare)  # a message type: its own group


def _describe(node: _Node) -> str:
    label = {"repeated": "repeated ", "map": ""}.get(node.label, "")
    return f"{label}{node.proto} ({node.type})"


def _json_error_field(text: str) -> str | None:
    """The field a ``json_format.ParseError`` is about, as a dotted path."""
    parts = re.findall(r"Failed to parse (\w+) field", text)
    unknown = re.search(r'has no field named "([^"]+)"', text)
    if unknown:
        parts.append(unknown[1])
    return ".".join(parts) or None


# -- explaining a payload that does not parse ----------------------------------------------

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_WIRE_NAMES: Final = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "start-group",
                      4: "end-group", 5: "32-bit"}
_FIXED64: Final = {_F.TYPE_FIXED64, _F.TYPE_SFIXED64, _F.TYPE_DOUBLE}
_FIXED32: Final = {_F.TYPE_FIXED32, _F.TYPE_SFIXED32, _F.TYPE_FLOAT}
_LENGTH: Final = {_F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE}


def _file_of(field: FieldDescriptor) -> str:
    """The name of the file that declares ``field``'s message."""
    return str(field.containing_type.file.name) if field.containing_type else ""


class _Stop(Exception):
    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.field = field


class _WireCheck:
    """A walk over the wire format with the descriptor, to say *where* a payload is wrong
    (upb only says that it is). Python speed: only run on payloads already refused, or
    that carry fields the type does not know."""

    def __init__(self, data: bytes, checked_utf8: frozenset[str]) -> None:
        self.data = data
        self.checked_utf8 = checked_utf8

    def problem(self, message: Descriptor) -> TypedPayloadError | None:
        try:
            self._message(0, len(self.data), message, "", None)
        except _Stop as stop:
            return TypedPayloadError(f"{message.full_name}: {stop}", field=stop.field)
        return None

    def _varint(self, pos: int, end: int, what: str, field: str | None) -> tuple[int, int]:
        value = shift = 0
        while True:
            if pos >= end:
                raise _Stop(f"truncated: {what} ends past the payload's end at byte "
                            f"{pos}", field)
            byte = self.data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos
            shift += 7
            if shift >= 70:
                raise _Stop(f"{what} at byte {pos} is a varint longer than 10 bytes", field)

    def _message(self, pos: int, end: int, message: Descriptor, path: str,
                 group: int | None) -> int:
        while pos < end:
            tag, pos = self._varint(pos, end, f"a tag in {path.rstrip('.') or 'the message'}",
                                    path.rstrip(".") or None)
            number, wire = tag >> 3, tag & 7
            field = message.fields_by_number.get(number)
            name = f"{path}{field.name}" if field is not None else None
            label = name or f"unknown field {number} of {path.rstrip('.') or 'the message'}"
            if number == 0:
                raise _Stop(f"field number 0 at byte {pos} (not a Protobuf encoding)", name)
            if wire == _EGROUP:
                if group == number:
                    return pos
                raise _Stop(f"an end-group tag for field {number} at byte {pos} that no "
                            "group opened", name)
            if field is not None:
                self._expect(field, wire, name or "")
            pos = self._value(pos, end, wire, field, number, label, name)
        if group is not None:
            raise _Stop(f"truncated: group {path.rstrip('.')} has no end", path.rstrip("."))
        return pos

    def _expect(self, field: FieldDescriptor, wire: int, name: str) -> None:
        if field.type == _F.TYPE_GROUP:
            want = _SGROUP
        elif field.type in _FIXED64:
            want = _I64
        elif field.type in _FIXED32:
            want = _I32
        elif field.type in _LENGTH:
            want = _LEN
        else:
            want = _VARINT
        if wire == want or (wire == _LEN and field.is_repeated and want != _SGROUP):
            return  # a repeated scalar may come packed
        raise _Stop(f"field {name} (number {field.number}) is {_proto_name(field)}"
                    f", encoded as {_WIRE_NAMES[want]}, but the payload has a "
                    f"{_WIRE_NAMES.get(wire, f'invalid ({wire})')} value", name)

    def _value(self, pos: int, end: int, wire: int, field: FieldDescriptor | None,
               number: int, label: str, name: str | None) -> int:
        if wire == _VARINT:
            return self._varint(pos, end, label, name)[1]
        if wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            if pos + size > end:
                raise _Stop(f"truncated: {label} needs {size} bytes at byte {pos}", name)
            return pos + size
        if wire == _LEN:
            size, pos = self._varint(pos, end, f"the length of {label}", name)
            if pos + size > end:
                raise _Stop(f"truncated: {label} is {size} bytes long at byte {pos}, "
                            f"past the payload's end ({end})", name)
            self._inside(pos, pos + size, field, name)
            return pos + size
        if wire == _SGROUP:
            inner = field.message_type if field is not None and field.message_type else None
            if inner is None:
                return self._skip_group(pos, end, number, label, name)
            return self._message(pos, end, inner, f"{name}.", number)
        raise _Stop(f"invalid wire type {wire} at byte {pos} ({label})", name)

    def _inside(self, start: int, end: int, field: FieldDescriptor | None,
                name: str | None) -> None:
        if field is None or name is None:
            return
        if field.type == _F.TYPE_MESSAGE and field.message_type is not None:
            self._message(start, end, field.message_type, f"{name}.", None)
        elif field.type == _F.TYPE_STRING and _file_of(field) in self.checked_utf8:
            try:
                self.data[start:end].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _Stop(f"string field {name} is not valid UTF-8 ({exc.reason} at "
                            f"byte {start + exc.start})", name) from None

    def _skip_group(self, pos: int, end: int, number: int, label: str,
                    name: str | None) -> int:
        while True:
            if pos >= end:
                raise _Stop(f"truncated: group {label} has no end", name)
            tag, pos = self._varint(pos, end, f"a tag in {label}", name)
            if tag & 7 == _EGROUP:
                if tag >> 3 != number:
                    raise _Stop(f"group {label} ends with another field's end tag", name)
                return pos
            pos = self._value(pos, end, tag & 7, None, tag >> 3, label, name)


def message_names(files: Mapping[str, FileDescriptorProto]) -> list[str]:
    """Full names of the messages the files declare (map entries left out): what a user
    may name as a stream's message."""
    return [n for f in files.values() for n in _message_names(f.package, f.message_type)]


def _varint(value: int) -> bytes:
    """``value`` as a Protobuf base-128 varint (a length prefix)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _framed(payloads: Sequence[bytes]) -> bytes:
    """The payloads as the repeated field 1 of a wrapper message (tag, length, bytes).

    Why maps and a table: this runs for every request, and a Python loop over its messages
    cost more than upb's parse of all of them; here each step iterates in C."""
    sizes = list(map(len, payloads))
    if max(sizes) < len(_HEADS):
        heads = list(map(_HEADS.__getitem__, sizes))
    else:
        heads = [_TAG_ONE + _varint(size) for size in sizes]
    return b"".join(chain.from_iterable(zip(heads, payloads, strict=True)))


_TAG_ONE: Final = b"\x0a"
"""Field 1, wire type 2 (length-delimited)."""
_HEADS: Final = tuple(_TAG_ONE + _varint(size) for size in range(1 << 14))
"""Tag and length of every payload under 16 KiB (one or two length bytes)."""
