"""``icefloe.toml``: one file configures every process.

The layers, bottom up: :mod:`~icefloe.config.model` (the sections and :class:`Config`, typed
frozen msgspec structs; the stream model is :mod:`icefloe.streams`),
:mod:`~icefloe.config.manifest` (the manifest queue's settings and the rules that keep them
safe together), :mod:`~icefloe.config.security` (tokens, TLS, proxies, limits),
:mod:`~icefloe.config.validate` (cross-key checks), :mod:`~icefloe.config.load` (file,
``ICEFLOE_*`` environment, flags, relative paths) and :mod:`~icefloe.config.reference` (the
README's table of every key). This face re-exports what callers use.
"""

from icefloe.config.load import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    FILE_ONLY,
    find_config,
    load_config,
    split_key_path,
)
from icefloe.config.manifest import ManifestConfig
from icefloe.config.model import (
    OUTPUT_PATHS,
    AdminSection,
    CatalogSection,
    CollectorSection,
    Config,
    IngestorSection,
    ManifestSection,
    QuerySection,
    StoreSection,
    TokenConfig,
)
from icefloe.config.validate import validate
from icefloe.streams import (
    COLUMN_TYPES,
    PARTITIONS,
    Column,
    RateLimit,
    StreamConfig,
    validate_stream,
)

__all__ = [
    "COLUMN_TYPES", "CONFIG_ENV", "DEFAULT_CONFIG", "FILE_ONLY", "OUTPUT_PATHS", "PARTITIONS",
    "AdminSection", "CatalogSection", "CollectorSection", "Column", "Config",
    "IngestorSection", "ManifestConfig", "ManifestSection", "QuerySection", "RateLimit",
    "StoreSection", "StreamConfig",
    "TokenConfig", "find_config", "load_config", "split_key_path", "validate",
    "validate_stream",
]
