"""A typed stream's columns from its type, and the rule for its event id field.

Why apart from the config loader: both the loader (a schema file) and the registry
resolver (:mod:`icefloe.registry.subjects`, a subject) derive the same columns the same way,
and the registry side must not depend on config loading.
"""

from __future__ import annotations

from collections.abc import Sequence

from icefloe.errors import ConfigError
from icefloe.streams.model import Column, TypedSchema
from icefloe.typed.kinds import schema_kind


def check_id_field(name: str, columns: Sequence[Column], label: str) -> None:
    """A typed stream's ``event_id_field``: a top-level text or integer field."""
    kinds = {c.name: c.type for c in columns}
    if name not in kinds:
        raise ConfigError(f"{label}: event_id_field {name!r} is not a top-level field of the "
                          f"type (fields: {', '.join(kinds)})")
    if kinds[name] not in ("string", "long", "int", "uuid"):
        raise ConfigError(f"{label}: event_id_field {name!r} is {kinds[name]}; an event id "
                          "field is a string, an integer or a uuid")


def typed_columns(format: str, schema: TypedSchema | None) -> tuple[Column, ...]:
    """The columns of a typed stream's type (``schema.text`` filled). Raises ValueError,
    :class:`TypeChangeError` or :class:`TypedPayloadError` naming what is wrong."""
    kind = schema_kind(format, schema)
    return tuple(Column(c.name, c.type, required=c.required, doc=c.doc)
                 for c in kind.columns())
