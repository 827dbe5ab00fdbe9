"""The manifest object: ordered batch entries, producer table, consumer state, footer.

Why one object rewritten by compare-and-swap: an object store offers no append and no
transactions, but it does offer conditional PUTs. Keeping the whole queue in one object
makes every change (append, ack, dequeue, epoch bump) a single atomic CAS, which is what
makes ordering, fencing and idempotent appends provable.

Why a line-oriented body: producers rewrite the manifest on every append, so its cost is
the ceiling of the whole cluster's append rate. Entries are stored one JSON object per
line, so an append concatenates new lines and a dequeue cuts leading lines — neither parses
the queued entries. Only the consumer, which must read them, decodes entries (lazily).

Layout (documented for other languages in ``docs/formats.md``)::

    body     line 1: JSON {"producers": {...}, "consumer": {...}}
             then one JSON entry per line, in sequence order, each ending in "\\n";
             the whole body zstd-compressed (one frame) when the footer says so
    footer   39 bytes, little-endian "<BQQIQIH4s":
             compression u8 (0 none, 1 zstd) | epoch u64 | next_sequence u64 |
             entry_count u32 | revision u64 | body_crc32c u32 | version u16 = 1 |
             magic "IFMQ"

``revision`` grows by one on every write, so no two writes ever have identical bytes (an
identical body would give an identical ETag and defeat the CAS).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import msgspec
import zstandard

from icefloe.checksum import crc32c
from icefloe.errors import ManifestCorruptError
from icefloe.zstd_contexts import compressor, decompressor

MAGIC = b"IFMQ"
VERSION = 1
FOOTER = struct.Struct("<BQQIQIH4s")
COMPRESS_ABOVE = 4096
ZSTD_LEVEL = 1


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One flushed batch file, in sequence order. Times are store-clock seconds."""

    sequence: int
    location: str
    size: int
    crc32c: int
    record_count: int
    streams: tuple[str, ...]
    ingested_at: float
    producer_id: str
    producer_batch: int
    registry_version: int = 0
    """The stream-registry version its events were accepted under (0: no registry, the
    config's streams); the collector routes the entry's events by it."""


class ProducerState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Idempotent-producer record: highest batch number appended and its sequence, and
    which lower numbers of the last write's group were refused (not appended).

    Why ``refused``: one group commit may refuse an older batch (past its deadline) and
    append a newer one. If that write's answer is lost, the retry must not take every
    number up to ``batch`` for appended: the refused ones were not, and answering them
    durable would lose acknowledged data. It holds only numbers below ``batch`` that the
    writing group could still be asked about, so it stays as small as one group's
    refusals; absent (empty) in manifests written before it existed, and then omitted.
    """

    batch: int
    sequence: int
    updated_at: float
    refused: tuple[int, ...] = ()


class ConsumerState(msgspec.Struct, frozen=True, kw_only=True):
    """Who consumes, until when its lease runs, and how far it has acknowledged."""

    holder: str = ""
    lease_expires_at: float = 0.0
    acked_through: int = -1


class _Header(msgspec.Struct, kw_only=True):
    producers: dict[str, ProducerState] = msgspec.field(default_factory=dict)
    consumer: ConsumerState = msgspec.field(default_factory=ConsumerState)


_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(_Header)
_entry_decoder = msgspec.json.Decoder(Entry)


def encode_entries(entries: Iterable[Entry]) -> bytes:
    """Entries as the body's NDJSON lines (each line ends in a newline)."""
    return b"".join(_encoder.encode(entry) + b"\n" for entry in entries)


class Manifest:
    """An immutable manifest value. Updates return a new value with the revision bumped.

    Entries live as NDJSON bytes (``lines``); ``entries`` decodes them on first use.
    """

    __slots__ = ("_entries", "consumer", "entry_count", "epoch", "lines", "next_sequence",
                 "producers", "revision")

    def __init__(self, *, entries: Iterable[Entry] | None = None, lines: bytes = b"",
                 entry_count: int | None = None,
                 producers: dict[str, ProducerState] | None = None,
                 consumer: ConsumerState | None = None, epoch: int = 0,
                 next_sequence: int = 0, revision: int = 0) -> None:
        self._entries: tuple[Entry, ...] | None = None
        if entries is not None:
            self._entries = tuple(entries)
            lines = encode_entries(self._entries)
            entry_count = len(self._entries)
        self.lines = lines
        self.entry_count = lines.count(b"\n") if entry_count is None else entry_count
        self.producers = producers if producers is not None else {}
        self.consumer = consumer if consumer is not None else ConsumerState()
        self.epoch = epoch
        self.next_sequence = next_sequence
        self.revision = revision

    # -- reading -------------------------------------------------------------------------

    @property
    def first_sequence(self) -> int:
        """Sequence of the oldest entry still queued (``next_sequence`` when empty)."""
        return self.next_sequence - self.entry_count

    @property
    def entries(self) -> tuple[Entry, ...]:
        """All queued entries, decoded once and cached."""
        if self._entries is None:
            try:
                self._entries = tuple(_entry_decoder.decode_lines(self.lines))
            except msgspec.DecodeError as exc:
                raise ManifestCorruptError(f"manifest entries cannot be decoded: {exc}") \
                    from exc
            self._check_sequences()
        return self._entries

    def entries_from(self, sequence: int) -> tuple[Entry, ...]:
        """Entries with ``sequence`` or later (entries are contiguous)."""
        return self.entries[max(0, sequence - self.first_sequence):]

    # -- updating ------------------------------------------------------------------------

    def _copy(self, **changes: Any) -> Manifest:
        fields: dict[str, Any] = {
            "lines": self.lines, "entry_count": self.entry_count,
            "producers": self.producers, "consumer": self.consumer, "epoch": self.epoch,
            "next_sequence": self.next_sequence, "revision": self.revision + 1}
        fields.update(changes)
        return Manifest(**fields)

    def replace(self, **changes: Any) -> Manifest:
        """A copy with ``changes`` (producers, consumer, epoch, next_sequence, entries)."""
        if "entries" in changes:
            entries = tuple(changes.pop("entries"))
            changes.update(lines=encode_entries(entries), entry_count=len(entries))
        return self._copy(**changes)

    def append(self, entries: list[Entry], **changes: Any) -> Manifest:
        """A copy with ``entries`` added at the end, without decoding the queued ones."""
        return self._copy(lines=self.lines + encode_entries(entries),
                          entry_count=self.entry_count + len(entries), **changes)

    def drop_first(self, count: int) -> Manifest:
        """A copy without the ``count`` oldest entries (a dequeue)."""
        if count <= 0:
            return self._copy()
        cut = 0
        for _ in range(count):
            cut = self.lines.index(b"\n", cut) + 1
        return self._copy(lines=self.lines[cut:], entry_count=self.entry_count - count)

    # -- bytes ---------------------------------------------------------------------------

    def encode(self) -> bytes:
        body = _encoder.encode(_Header(producers=self.producers, consumer=self.consumer)) \
            + b"\n" + self.lines
        compression = 0
        if len(body) > COMPRESS_ABOVE:
            body = compressor(ZSTD_LEVEL).compress(body)
            compression = 1
        footer = FOOTER.pack(compression, self.epoch, self.next_sequence, self.entry_count,
                             self.revision, crc32c(body), VERSION, MAGIC)
        return body + footer

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        if len(data) < FOOTER.size:
            raise ManifestCorruptError(
                f"manifest is {len(data)} bytes, shorter than its {FOOTER.size}-byte footer")
        body, footer = data[:-FOOTER.size], data[-FOOTER.size:]
        (compression, epoch, next_sequence, entry_count, revision, body_crc, version,
         magic) = FOOTER.unpack(footer)
        if magic != MAGIC:
            raise ManifestCorruptError(f"manifest magic is {magic!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise ManifestCorruptError(f"manifest version {version} is not supported "
                                       f"(this icefloe reads version {VERSION})")
        if crc32c(body) != body_crc:
            raise ManifestCorruptError("manifest body checksum mismatch")
        try:
            if compression == 1:
                body = decompressor().decompress(body)
            elif compression != 0:
                raise ManifestCorruptError(f"manifest compression {compression} is unknown")
            split = body.index(b"\n")
            header = _header_decoder.decode(body[:split])
        except (zstandard.ZstdError, msgspec.DecodeError, ValueError) as exc:
            raise ManifestCorruptError(f"manifest body cannot be decoded: {exc}") from exc
        manifest = cls(lines=body[split + 1:], producers=header.producers,
                       consumer=header.consumer, epoch=epoch, next_sequence=next_sequence,
                       revision=revision)
        manifest._check_counts(entry_count)
        return manifest

    def _check_counts(self, entry_count: int) -> None:
        """Cheap invariants checked on every read; entries are checked when decoded."""
        if entry_count != self.entry_count:
            raise ManifestCorruptError(
                f"footer says {entry_count} entries, body holds {self.entry_count}")
        if self.lines and not self.lines.endswith(b"\n"):
            raise ManifestCorruptError("manifest entries do not end with a newline")
        if self.entry_count > self.next_sequence:
            raise ManifestCorruptError(
                f"{self.entry_count} entries cannot precede next_sequence {self.next_sequence}")
        if self.consumer.acked_through >= self.next_sequence:
            raise ManifestCorruptError(
                f"acked_through {self.consumer.acked_through} is beyond the last sequence")

    def _check_sequences(self) -> None:
        first = self.first_sequence
        for offset, entry in enumerate(self._entries or ()):
            if entry.sequence != first + offset:
                raise ManifestCorruptError(
                    f"sequences not contiguous: expected {first + offset}, "
                    f"found {entry.sequence}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return (self.lines, self.entry_count, self.producers, self.consumer, self.epoch,
                self.next_sequence, self.revision) == (
            other.lines, other.entry_count, other.producers, other.consumer, other.epoch,
            other.next_sequence, other.revision)

    __hash__ = None  # type: ignore[assignment]  # unhashable: equal by mutable fields

    def __repr__(self) -> str:
        return (f"Manifest(epoch={self.epoch}, entries={self.first_sequence}.."
                f"{self.next_sequence - 1}, revision={self.revision})")
