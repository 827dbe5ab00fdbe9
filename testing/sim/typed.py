"""The ``protobuf-rename`` family's message types (#39), built in code.

Why in code and not with ``protoc``: a seed must replay exactly and run without a
subprocess; ``descriptor_pb2`` gives the same FileDescriptorSet bytes every time. Version 1
is what the source is seeded with; version 2 is what the operator deploys mid-run: the
top-level ``amount`` renamed ``total`` and the nested ``Detail.note`` renamed
``Detail.label`` (numbers kept: the same columns), and ``channel`` added. Producers that
were not upgraded keep sending version 1 messages, which version 2 reads by field number.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from icefloe.config.typed_streams import with_typed_columns
from icefloe.streams.model import Column, StreamConfig, TypedSchema

SOURCE = "s0"
"""The Protobuf source (the others stay JSON)."""
MESSAGE = "sim.readings.Reading"
RENAMED = {"amount": "total", "detail.note": "detail.label"}
"""v1 column path → v2 column path (same field numbers)."""
ADDED = "channel"
"""v2's new field (number 6)."""

_F = descriptor_pb2.FieldDescriptorProto


def descriptor_set(version: int) -> bytes:
    """The FileDescriptorSet of ``sim/readings.proto`` at ``version`` (1 or 2)."""
    v2 = version == 2
    proto = descriptor_pb2.FileDescriptorProto(name="sim/readings.proto",
                                               package="sim.readings", syntax="proto3")
    detail = proto.message_type.add(name="Detail")
    detail.field.add(name="label" if v2 else "note", number=1, type=_F.TYPE_STRING,
                     label=_F.LABEL_OPTIONAL)
    detail.field.add(name="weight", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    reading = proto.message_type.add(name="Reading")
    reading.field.add(name="uid", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    reading.field.add(name="n", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    reading.field.add(name="total" if v2 else "amount", number=3, type=_F.TYPE_INT64,
                      label=_F.LABEL_OPTIONAL)
    reading.field.add(name="detail", number=4, type=_F.TYPE_MESSAGE,
                      type_name=".sim.readings.Detail", label=_F.LABEL_OPTIONAL)
    reading.field.add(name="tags", number=5, type=_F.TYPE_STRING, label=_F.LABEL_REPEATED)
    if v2:
        reading.field.add(name=ADDED, number=6, type=_F.TYPE_STRING,
                          label=_F.LABEL_OPTIONAL)
    return descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString(
        deterministic=True)


def schema(version: int) -> TypedSchema:
    """The registry source's type at ``version`` (the descriptor set inline, base64)."""
    return TypedSchema(message=MESSAGE, text=base64.b64encode(descriptor_set(version)).decode())


@cache
def columns(version: int) -> tuple[Column, ...]:
    """The columns icefloe derives from the message at ``version`` (as the config loader
    does for ``icefloe.toml``)."""
    stream = StreamConfig(name="typed", table="sim.typed", columns=(), format="protobuf",
                          schema=schema(version))
    return with_typed_columns((stream,), _NOWHERE, "sim")[0].columns


class _Nowhere:
    """No file is read: the schema's text is inline."""

    def __truediv__(self, other: object) -> _Nowhere:
        raise AssertionError("the simulator's descriptor sets are inline")


_NOWHERE: Any = _Nowhere()


@cache
def message_class(version: int) -> Any:
    """The ``Reading`` class at ``version``, in a pool of its own (both versions of one
    file cannot share a pool)."""
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set(version)).file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(MESSAGE))


@dataclass(frozen=True)
class Sent:
    """One message's values, as v2 names them (``channel`` None: sent as version 1)."""

    n: int
    total: int
    label: str
    weight: int
    tags: tuple[str, ...]
    channel: str | None

    def row(self) -> dict[str, Any]:
        """The row the table must hold for it, under v2's column names."""
        return {"n": self.n, "total": self.total,
                "detail": {"label": self.label, "weight": self.weight},
                "tags": list(self.tags), ADDED: self.channel}


def reading(version: int, uid: str, n: int) -> tuple[bytes, Sent]:
    """A message of ``version`` for event ``n`` and the values it carries."""
    sent = Sent(n=n, total=n * 7 + 1, label=f"L{n % 13}", weight=n % 5 + 1,
                tags=tuple(f"t{j}" for j in range(n % 3)),
                channel=f"c{n % 4}" if version == 2 else None)
    cls = message_class(version)
    msg = cls(uid=uid, n=n, tags=list(sent.tags))
    if version == 2:
        msg.total = sent.total
        msg.detail.label = sent.label
        setattr(msg, ADDED, sent.channel)
    else:
        msg.amount = sent.total
        msg.detail.note = sent.label
    msg.detail.weight = sent.weight
    return msg.SerializeToString(deterministic=True), sent
