"""Object stores selected by URL: ``file:///path`` or ``s3://bucket/prefix``.

``open_store`` gives the synchronous flavour (Spark workers, CLI), ``open_async_store`` the
asyncio one (ingestor, collector). Both come wrapped in the retry layer, so callers only
ever see a transient error once its retry budget is spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import ConfigError
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.base import (
    AsyncObjectStore,
    GetResult,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
)
from icefloe.store.failpoints import wrap_if_configured
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryingStore, RetryPolicy
from icefloe.store.split import SplitAsyncStore

if TYPE_CHECKING:  # boto3/aiobotocore import slowly: load them only for s3:// URLs
    from icefloe.store.s3 import S3Options

__all__ = [
    "AsyncObjectStore",
    "GetResult",
    "ListResult",
    "ObjectInfo",
    "ObjectStore",
    "PutResult",
    "RetryPolicy",
    "StoreOptions",
    "open_async_store",
    "open_store",
    "options_for",
    "wrap_async",
]


@dataclass(frozen=True)
class StoreOptions:
    """Everything besides the URL that selects and tunes a store (``s3`` None = defaults)."""

    s3: S3Options | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    local_store: Callable[[str], AsyncObjectStore] | None = None
    """What serves a ``file://`` store's directory in :func:`open_async_store` (None: a
    :class:`~icefloe.store.local.LocalStore` in worker threads). The ingestor passes its
    store helper process here (``[ingestor] store_helper``)."""
    clock: Clock = SYSTEM
    """What the retry layer's backoff and budget are measured on (a test's manual clock)."""


def options_for(endpoint_url: str | None, region: str | None) -> StoreOptions:
    """Options for a ``[store]`` section's S3 settings (they only matter for ``s3://``)."""
    if endpoint_url is None and region is None:
        return StoreOptions()
    from icefloe.store.s3 import S3Options  # lazy: aiobotocore

    return StoreOptions(s3=S3Options(endpoint_url=endpoint_url, region=region))


def _scheme(url: str) -> str:
    scheme = urlparse(url).scheme
    if scheme not in ("file", "s3"):
        raise ConfigError(
            f"unsupported store url {url!r}: use file:///absolute/path or s3://bucket/prefix"
        )
    return scheme


def local_path(url: str) -> str:
    """The directory of a ``file://`` URL (``file:///var/lib/x`` → ``/var/lib/x``)."""
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ConfigError(f"store url {url!r}: file URLs need an absolute path (file:///...)")
    if not parsed.path:
        raise ConfigError(f"store url {url!r} has no path")
    return unquote(parsed.path)


def open_store(url: str, options: StoreOptions | None = None) -> ObjectStore:
    """A synchronous, retrying store for ``url``."""
    options = options or StoreOptions()
    if _scheme(url) == "file":
        inner: ObjectStore = LocalStore(local_path(url))
    else:
        from icefloe.store.s3 import S3Options, S3Store  # lazy: aiobotocore

        inner = S3Store(url, options.s3 or S3Options())
    return RetryingStore(inner, options.retry, clock=options.clock)


def open_async_store(url: str, options: StoreOptions | None = None, *,
                     control_url: str | None = None) -> AsyncObjectStore:
    """An asyncio, retrying store for ``url`` (aiobotocore for S3).

    With a ``control_url`` other than ``url``, batch files stay at ``url`` and the manifest,
    registry, staging state and probe object go to ``control_url``
    (:mod:`icefloe.store.split` says why)."""
    options = options or StoreOptions()
    if control_url and control_url.rstrip("/") != url.rstrip("/"):
        return SplitAsyncStore(open_async_store(url, options),
                               open_async_store(control_url, options))
    scheme = _scheme(url)
    if scheme == "file" and options.local_store is not None:
        inner: AsyncObjectStore = options.local_store(local_path(url))
    elif scheme == "file":
        inner = ThreadedAsyncStore(LocalStore(local_path(url)))
    else:
        from icefloe.store.s3 import AsyncS3Store, S3Options  # startup time: aiobotocore

        inner = AsyncS3Store(url, options.s3 or S3Options())
    return wrap_async(inner, options)


def wrap_async(inner: AsyncObjectStore, options: StoreOptions) -> AsyncObjectStore:
    """``inner`` as every caller gets it: behind the faults ``ICEFLOE_STORE_FAULTS`` injects
    (if set) and the retry layer."""
    return RetryingAsyncStore(wrap_if_configured(inner), options.retry,
                              clock=options.clock)
