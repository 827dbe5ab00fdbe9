"""The staging layout in the object store: where staged rows and their state live, and the
state object's format.

Why in the core: the collector writes it (:mod:`collector.staging`: when to stage, commit
and sweep), and the admin API reads it (a registry tombstone is kept while its table still
has staged rows). Both must agree on keys and bytes, and neither may import the other, so
the layout is stated here once::

    staging/<table>/state.json                                  StagingState (JSON)
    staging/<table>/<first:012d>-<last:012d>-<id>.parquet       one staged file

``first``/``last`` are the lowest and highest run positions of its rows (a position is
``shard << 40 | sequence``; shard 0's equal its sequences); ``id`` makes a retried write a
new object. The state is written by compare-and-swap and records the epoch of its last
writer, so a replaced collector's write is refused.

**Shards.** With several manifest shards nothing orders sequences of different shards, so
what is staged is recorded per shard: the state's ``through_sequences`` (shard ->
sequence staged through) and each file's ``sequences`` (shard -> its last sequence of that
shard). ``through_sequence`` stays shard 0's, and a state written before shards (format 1,
no per-shard fields) reads as all shard 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

__all__ = [
    "FORMAT", "PREFIX", "SHARDED_FORMAT", "STATE_SUFFIX", "StagedFile", "StagingState", "data_key",
    "merge_through", "state_key", "table_of_state",
]

PREFIX = "staging"
"""Top-level key prefix of everything staged."""
FORMAT = 1
"""Version of the state object's format: a state that only ever staged shard 0 is written
exactly as before shards, so an older collector still reads it."""
SHARDED_FORMAT = 2
"""The format of a state with per-shard fields (rows of a shard above 0 were staged)."""
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
    sequences: dict[int, int] = {}
    """Per manifest shard, the last sequence of that shard in the file (empty: a file
    staged before shards, all shard 0, through ``last_sequence``)."""

    @property
    def through(self) -> dict[int, int]:
        """The last sequence per shard this file holds."""
        return dict(self.sequences) if self.sequences else {0: self.last_sequence}


class StagingState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What is staged for one table; ``revision`` changes on every write (new ETag)."""

    format: int = FORMAT
    table: str = ""
    epoch: int = 0
    revision: int = 0
    through_sequence: int = -1
    """Shard 0's sequence staged through (what a reader that knows no shards sees)."""
    files: tuple[StagedFile, ...] = ()
    through_sequences: dict[int, int] = {}
    """Per manifest shard, the sequence staged through: the run rows of that shard at or
    below it are staged (or were committed). Empty: a format-1 state, all shard 0."""

    @property
    def staged_through(self) -> dict[int, int]:
        """Per shard, the sequence staged through; a shard never staged is absent."""
        if self.through_sequences:
            return dict(self.through_sequences)
        return {0: self.through_sequence} if self.through_sequence >= 0 else {}

    def with_through(self, through: Mapping[int, int]) -> StagingState:
        """This state staged through ``through`` as well (per shard, the higher)."""
        merged = self.staged_through
        for shard, seq in through.items():
            merged[shard] = max(merged.get(shard, -1), seq)
        sharded = any(shard for shard in merged)
        return msgspec.structs.replace(
            self, format=SHARDED_FORMAT if sharded or self.through_sequences else self.format,
            through_sequence=merged.get(0, -1),
            through_sequences=merged if sharded or self.through_sequences else {})

    def encode(self) -> bytes:
        """JSON; the per-shard fields only where they say more than shard 0's (so a
        single-shard state keeps its format-1 bytes)."""
        doc = msgspec.to_builtins(self)
        if not self.through_sequences:
            del doc["through_sequences"]
        for staged in doc["files"]:
            if not staged["sequences"]:
                del staged["sequences"]
        return msgspec.json.encode(doc)

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
        """The highest run position staged (logs; shard 0's sequence on one shard)."""
        return max((f.last_sequence for f in self.files), default=-1)

    @property
    def last_sequences(self) -> dict[int, int]:
        """Per shard, the highest sequence of the staged files (absent: none staged)."""
        return merge_through(f.through for f in self.files)


def merge_through(parts: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """Per shard, the highest sequence of any of ``parts``."""
    out: dict[int, int] = {}
    for part in parts:
        for shard, seq in part.items():
            out[shard] = max(out.get(shard, -1), seq)
    return out


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
