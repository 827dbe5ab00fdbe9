"""The staging layout in the object store: where staged rows and their state live, and the
state object's format.

Why in the core: the collector writes it (:mod:`collector.staging`: when to stage, commit
and sweep), and the admin API reads it (a registry tombstone is kept while its table still
has staged rows). Both must agree on keys and bytes, and neither may import the other, so
the layout is stated here once::

    staging/<table>/state.json                                  StagingState (JSON)
    staging/<table>/<first:012d>-<last:012d>-<id>.parquet       one staged file

``first``/``last`` are the lowest and highest manifest sequences of its rows; ``id`` makes
a retried write a new object. The state is written by compare-and-swap and records the
epoch of its last writer, so a replaced collector's write is refused.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "FORMAT", "PREFIX", "STATE_SUFFIX", "StagedFile", "StagingState", "data_key",
    "state_key", "table_of_state",
]

PREFIX = "staging"
"""Top-level key prefix of everything staged."""
FORMAT = 1
"""Version of the state object's format."""
STATE_SUFFIX = "/state.json"


class StagedFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One staged Parquet file: its key, the sequences and rows it holds, its size and its
    oldest row's receive time (ms since the epoch)."""

    key: str
    first_sequence: int
    last_sequence: int
    rows: int
    bytes: int
    oldest_ms: int


class StagingState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What is staged for one table; ``revision`` changes on every write (new ETag)."""

    format: int = FORMAT
    table: str = ""
    epoch: int = 0
    revision: int = 0
    through_sequence: int = -1
    files: tuple[StagedFile, ...] = ()

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> StagingState:
        return msgspec.json.decode(data, type=cls)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def oldest_ms(self) -> int | None:
        return min((f.oldest_ms for f in self.files), default=None)

    @property
    def last_sequence(self) -> int:
        return max((f.last_sequence for f in self.files), default=-1)


def state_key(table: str) -> str:
    """The key of ``table``'s state object."""
    return f"{PREFIX}/{table}{STATE_SUFFIX}"


def table_of_state(key: str) -> str | None:
    """The table whose state object ``key`` is, or None if it is no state key (a staged
    file, or something else under the prefix)."""
    head = PREFIX + "/"
    if not key.startswith(head) or not key.endswith(STATE_SUFFIX):
        return None
    return key[len(head):-len(STATE_SUFFIX)]


def data_key(table: str, first: int, last: int, unique: str) -> str:
    """The key of a staged file of ``table`` holding sequences ``first``..``last``."""
    return f"{PREFIX}/{table}/{first:012d}-{last:012d}-{unique}.parquet"
