"""Change streams at the door (#42): change events rewritten into rows before validation.

Why a step of its own before the validator: the validator (:mod:`ingestor.validate`) knows
rows; a change stream's events are envelopes around rows. Each is decoded once here,
flattened by :class:`icefloe.streams.cdc.Flattener`, and the flat rows go through the
stream's ordinary validation, so types, mappings and ``unknown_fields`` work unchanged.
Costs a Python object per event (change streams trade speed for applying changes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from icefloe.streams.cdc import ChangeError, Flattener

NULL_EVENT = ("a null change event (a Kafka tombstone) carries no change: icefloe ignores "
              "null values only from the Kafka listener; send the delete (op d) alone")


class Refusal(NamedTuple):
    """Why change event ``index`` cannot be applied."""

    at: int
    field: str | None
    reason: str
    code: str


class Flat(NamedTuple):
    """The events as rows (JSON objects) and each one's event id."""

    rows: list[bytes]
    ids: list[str | None]


_encode = msgspec.json.Encoder().encode


def flatten_events(flattener: Flattener, events: Sequence[bytes], limit: int
                   ) -> tuple[Flat, list[Refusal]]:
    """Each event decoded on its own and flattened; up to ``limit`` refusals are listed
    (any refusal refuses the request, as a row that fails validation does)."""
    rows: list[bytes] = []
    ids: list[str | None] = []
    refused: list[Refusal] = []
    for index, event in enumerate(events):
        try:
            done = flattener.flatten(msgspec.json.decode(event))
        except msgspec.DecodeError as exc:
            refused.append(Refusal(index, None, f"malformed JSON: {exc}", "invalid_json"))
        except UnicodeDecodeError as exc:
            refused.append(Refusal(index, None, f"not UTF-8 (byte {exc.start}: "
                                   f"{exc.reason}); JSON must be UTF-8", "invalid_utf8"))
        except RecursionError:
            refused.append(Refusal(index, None, "the JSON nests deeper than the decoder "
                                   "allows", "json_too_deep"))
        except ChangeError as exc:
            refused.append(Refusal(index, exc.field, exc.reason, "invalid_change"))
        else:
            if done is None:
                refused.append(Refusal(index, None, NULL_EVENT, "invalid_change"))
            else:
                rows.append(_encode(done[0]))
                ids.append(done[1])
        if len(refused) >= limit:
            break
    return Flat(rows, ids), refused


def without_nulls(values: Sequence[bytes | None]) -> tuple[list[bytes], list[int]]:
    """A Kafka batch's values without its null ones (a Debezium tombstone follows each
    delete: the delete already removed the key) and the indexes of those kept."""
    kept = [i for i, value in enumerate(values) if value is not None]
    return [values[i] for i in kept], kept  # type: ignore[misc]  # no nulls kept
