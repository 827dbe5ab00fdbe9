"""Every error icefloe raises on purpose, in one flat module.

Why one module: callers branch on *what failed* (a lost CAS race, a fenced consumer, a full
queue), never on which module raised it, and a single list keeps the taxonomy reviewable::

    IcefloeError
    ├── ConfigError                  bad configuration: fix the file/flag named in the message
    ├── BatchFormatError             a batch file or record envelope is malformed (``reason``)
    ├── IntegrityError               bytes read do not match the size/checksum recorded for them
    ├── StoreError                   object-store failures, translated at the store boundary
    │   ├── PreconditionFailed       conditional PUT lost (412, or S3's 409 conflict)
    │   ├── NotFound                 no such key
    │   ├── TransientStoreError      throttling, 5xx, timeouts, resets: retried with backoff
    │   └── PermanentStoreError      auth, no such bucket, bad endpoint: surfaced at once
    │       └── ConditionalWritesUnsupported   the store ignores If-Match/If-None-Match
    └── ManifestError                manifest queue outcomes
        ├── FencedError              a newer consumer epoch exists: this consumer must stop
        ├── LeaseHeldError           another consumer's lease is live: wait as a standby
        ├── ManifestMismatchError    tables hold sequences this manifest never issued
        ├── QueueFullError           the manifest reached its bound: back off (429/503)
        ├── DeadlineExceededError    a batch became too old to append (GC may delete it)
        └── ManifestCorruptError     the manifest object cannot be parsed
    ConfigError
    └── SchemaConflictError          configured columns cannot evolve the existing table
    CatalogError                     the Iceberg catalog is unreachable or refused an operation
    TableFencedError                 a table records a newer collector epoch: we were replaced
    OffsetLostError                  a table's snapshot log no longer says what icefloe committed
    RegistryError                    a refused change to the stream registry (``status``, ``code``)
    SchemaRegistryError              a refused schema registry request (Confluent's ``error_code``)
    RegistryBehindError              an entry needs a registry version the store does not have
    RoutingUnsupportedError          the cluster output path cannot route this run (a shared table)
    ModelError                       a Python model class (or its instance) that cannot be a stream
"""

from __future__ import annotations

from typing import Any


class IcefloeError(Exception):
    """Base class of every error icefloe raises deliberately.

    Pickled as its message and attributes, never through its ``__init__``: many subclasses
    take other arguments than the message (``FencedError(our, current)``), which the default
    pickling would pass the message alone, so the error failed to *unpickle* where it
    crossed a process (the local store's helper answers with the exception it raised).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[IcefloeError], args: tuple[Any, ...],
             state: dict[str, Any]) -> IcefloeError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ConfigError(IcefloeError):
    """Invalid configuration; the message names the file, key and reason."""


class BatchFormatError(IcefloeError):
    """A batch file or record envelope violates the format.

    ``reason`` is a stable machine-readable code (e.g. ``"short_footer"``); the message
    says what was expected and what was found.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class IntegrityError(IcefloeError):
    """Bytes read from the store differ from the size or checksum recorded for them."""


class StoreError(IcefloeError):
    """An object-store operation failed. ``op`` and ``key`` say which one.

    ``ambiguous``: a write may have been applied although no success was seen. A
    :class:`TransientStoreError` says so of itself; any other store error says so when an
    earlier attempt of the same operation was (a write whose answer was lost, retried into
    a :class:`PreconditionFailed` because it had landed) -- set by the layer that saw it
    (the retry layer, a compare-and-swap loop), so a caller that must tell "not stored"
    from "perhaps stored" can trust False.
    """

    ambiguous: bool = False

    def __init__(self, message: str, *, op: str = "", key: str = "") -> None:
        super().__init__(message)
        self.op = op
        self.key = key


class PreconditionFailed(StoreError):
    """A conditional write lost: the object changed (If-Match) or exists (If-None-Match)."""


class NotFound(StoreError):
    """The key does not exist."""


class TransientStoreError(StoreError):
    """A failure that may succeed when retried: throttling, 5xx, timeouts, resets.

    ``ambiguous`` is True when the request may have been applied although no success was
    seen (e.g. the response was lost); callers that append must be idempotent about it.
    """

    def __init__(self, message: str, *, op: str = "", key: str = "", ambiguous: bool = True,
                 code: str = "") -> None:
        super().__init__(message, op=op, key=key)
        self.ambiguous = ambiguous
        self.code = code


class PermanentStoreError(StoreError):
    """A failure that retrying cannot fix (credentials, missing bucket, bad endpoint)."""


class ConditionalWritesUnsupported(PermanentStoreError):
    """The store accepted a conditional PUT that must have failed: CAS is not safe on it."""


class ManifestError(IcefloeError):
    """Base of manifest queue outcomes."""


class FencedError(ManifestError):
    """This consumer's epoch is no longer current: another consumer took over."""

    def __init__(self, our_epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"fenced: this consumer holds epoch {our_epoch} but the manifest is at epoch "
            f"{current_epoch}; another collector took over, so this one must stop"
        )
        self.our_epoch = our_epoch
        self.current_epoch = current_epoch


class LeaseHeldError(ManifestError):
    """Another consumer holds a live lease: wait as a standby (or take over explicitly)."""

    def __init__(self, holder: str, remaining_s: float) -> None:
        super().__init__(f"{holder} holds the manifest lease for {remaining_s:.1f} s more")
        self.holder = holder
        self.remaining_s = remaining_s


class ManifestMismatchError(ManifestError):
    """Tables hold sequences the manifest never issued (reset manifest, wrong store)."""


class QueueFullError(ManifestError):
    """The manifest holds its maximum entries/bytes: the collector lags; retry later."""


class DeadlineExceededError(ManifestError):
    """A batch file is older than the append deadline and will never be appended."""


class ManifestCorruptError(ManifestError):
    """The manifest object cannot be decoded."""


class CatalogError(IcefloeError):
    """The Iceberg catalog cannot be reached or refused an operation; the message says which."""


class TableNotFoundError(CatalogError):
    """The catalog has no such table (pyiceberg's ``NoSuchTableError``, translated at
    :mod:`pipeline.iceberg.errors`)."""


class NamespaceNotFoundError(CatalogError):
    """The catalog has no such namespace (pyiceberg's ``NoSuchNamespaceError``)."""


class AlreadyExistsError(CatalogError):
    """A table or namespace being created exists already: someone else created it first
    (pyiceberg's ``TableAlreadyExistsError``/``NamespaceAlreadyExistsError``)."""


class CommitConflictError(CatalogError):
    """An Iceberg commit lost a race: someone else committed first, so re-read and plan
    again (pyiceberg's ``CommitFailedException``; icefloe's tables never retry it blindly,
    ``commit.retry.num-retries=0``)."""


class CommitUnknownError(CatalogError):
    """The catalog could not say whether an Iceberg commit landed (pyiceberg's
    ``CommitStateUnknownException``): read the table to settle it."""


class IcebergValidationError(CatalogError):
    """A commit's checks failed against the table as it is now, e.g. the files an
    overwrite meant to replace are gone (pyiceberg's ``ValidationException``)."""


class TableMismatchError(CatalogError):
    """A table's schema no longer takes the rows (changed outside icefloe): a failure of
    that table alone, never retried blindly (the collector parks the table)."""


class SchemaConflictError(ConfigError):
    """A stream's configured columns cannot be applied to its existing Iceberg table."""


class TableFencedError(IcefloeError):
    """An Iceberg table records a newer collector epoch than ours: we were replaced."""

    def __init__(self, table: str, our_epoch: int, table_epoch: int) -> None:
        super().__init__(
            f"fenced: table {table} was committed by collector epoch {table_epoch}, this "
            f"collector holds epoch {our_epoch}; another collector took over, so this one "
            "must stop"
        )
        self.table = table
        self.our_epoch = our_epoch
        self.table_epoch = table_epoch


class OffsetLostError(IcefloeError):
    """A table has snapshots, but the one recording ``icefloe.sequence`` was expired or
    rewritten outside icefloe: its committed offset is unknown, and replaying from the
    start would commit every entry still in the manifest a second time."""

    def __init__(self, table: str) -> None:
        super().__init__(
            f"table {table}: no snapshot left in its log records icefloe.sequence (the "
            "collector's committed offset); a snapshot expiry or rewrite outside icefloe "
            "removed it. Refusing to commit to it, because replaying from the start would "
            "duplicate rows. Restore the table to a snapshot that records the offset, or "
            "record it: append an empty snapshot whose summary has icefloe.epoch = 0 and "
            "icefloe.sequence = the highest _sequence in the table (SELECT max(_sequence) "
            f"FROM {table}; `sequence` in the dead-letter table), or -1 if icefloe never "
            "wrote to it. Expire snapshots of icefloe tables only through icefloe's "
            "maintenance, which keeps the offset."
        )
        self.table = table


class RegistryError(IcefloeError):
    """A change to the stream registry was refused: ``status`` is the HTTP status the admin
    API answers with, ``code`` a stable machine-readable reason, ``details`` the items
    (field and reason) a client needs to fix its request."""

    def __init__(self, status: int, code: str, message: str,
                 details: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details or []


class SchemaRegistryError(IcefloeError):
    """A schema registry request was refused, in the Confluent Schema Registry's terms:
    ``status`` is the HTTP status, ``error_code`` Confluent's code (40401 subject not found,
    42201 invalid schema, 409 incompatible, ...), so its clients branch on it as they do
    against Confluent's server."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


class RegistryBehindError(IcefloeError):
    """A manifest entry was accepted under a registry version newer than the registry the
    collector can read: routing waits (the run is retried) rather than guessing."""


class RoutingUnsupportedError(IcefloeError):
    """The collector's output path cannot deliver this run as the registry routes it."""


class ModelError(IcefloeError, ValueError):
    """A Python model class that cannot become a stream (an unsupported annotation, a bare
    ``Decimal``, a recursive model), or an instance that cannot become an event (a naive
    datetime, a decimal beyond its precision); the message names the field path
    (``Order.items[2].price``) and the type or value (:mod:`icefloe.pymodels`)."""
