"""Loading ``icefloe.toml``: find the file, merge flag > environment > file > default,
resolve relative paths, validate.

Environment names are ``ICEFLOE_<SECTION>_<KEY>`` (e.g. ``ICEFLOE_INGESTOR_HTTP_PORT``,
``ICEFLOE_STORE_URL``); OndatraSQL's ``COLLECT_PORT`` / ``COLLECT_ADMIN_PORT`` are read too
(:func:`_apply_collect_env`). Relative ``file:`` paths, SQLite paths and TLS files resolve against
the config file's folder. Every failure is a :class:`ConfigError` naming the file and the
key, never a stack trace from deep inside a server.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from icefloe.config.model import (
    AdminSection,
    CatalogSection,
    CollectorSection,
    Config,
    IngestorSection,
    ManifestSection,
    QuerySection,
    StoreSection,
)
from icefloe.config.typed_streams import prepare_raw, with_typed_columns
from icefloe.config.validate import validate
from icefloe.errors import ConfigError
from icefloe.otlp.config import OtlpSection, with_otlp_streams
from icefloe.streams.cdc import with_cdc_columns
from icefloe.streams.events_sql import with_events_files

CONFIG_ENV = "ICEFLOE_CONFIG"
DEFAULT_CONFIG = "icefloe.toml"


def find_config(path: str | os.PathLike[str] | None, env: Mapping[str, str] = os.environ
                ) -> Path | None:
    """``--config``, else ``$ICEFLOE_CONFIG``, else ``./icefloe.toml`` if present."""
    if path is not None:
        return Path(path)
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    default = Path(DEFAULT_CONFIG)
    return default if default.exists() else None


def load_config(path: str | os.PathLike[str] | None = None, *,
                env: Mapping[str, str] = os.environ,
                overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Load, merge (flag > env > file > default), resolve paths and validate."""
    source = find_config(path, env)
    raw: dict[str, Any] = {}
    where = "defaults"
    if source is not None:
        where = str(source)
        try:
            raw = tomllib.loads(source.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{source}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read config file: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    _apply_collect_env(raw, env)
    _apply_env(raw, env, where)
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    prepare_raw(raw, where)
    try:
        config = msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {_key_path(str(exc))}") from None
    base = source.parent.absolute() if source is not None else Path.cwd()
    config = _resolve_paths(config, base, str(source) if source else None)
    if config.collector.models_dir:  # streams declared as models/SCHEMA/NAME.sql files
        streams = with_events_files(config.streams, Path(config.collector.models_dir), where)
        config = msgspec.structs.replace(config, streams=streams)
    if any(s.format != "json" or s.schema is not None for s in config.streams):
        streams = with_typed_columns(config.streams, base, where)
        config = msgspec.structs.replace(config, streams=streams)
    streams = with_otlp_streams(config.streams, config.otlp, where)  # [otlp]'s, if enabled
    config = msgspec.structs.replace(config, streams=streams)
    if any(s.cdc is not None for s in config.streams):  # change streams' own columns
        config = msgspec.structs.replace(config, streams=with_cdc_columns(config.streams, where))
    validate(config, where)
    return config


def split_key_path(message: str) -> tuple[str | None, str]:
    """msgspec says 'Expected `int`, got `str` - at `$.ingestor.http_port`': (key, reason),
    key None when the message names none."""
    if " - at `$." in message:
        reason, key = message.rsplit(" - at `$.", 1)
        return key.rstrip("`"), reason
    return None, message


def _key_path(message: str) -> str:
    """A msgspec message led by the key it is about."""
    key, reason = split_key_path(message)
    return reason if key is None else f"{key}: {reason}"


FILE_ONLY = frozenset({"properties", "client_rate_limit", "spark_conf", "partition_by",
                       "sort_by", "table_properties", "rate_limit"})
"""Settings that are tables: set in the file only, never from the environment."""
_LIST_FIELDS = frozenset({"cors_origins", "trusted_proxies", "models", "tokens", "kinds"})
"""Lists the environment gives comma-separated."""


_HASH_START = re.compile(r",(?=\s*(?:scrypt|pbkdf2-sha256)\$)")
"""A comma that starts another token hash: a scrypt hash has commas of its own
(``scrypt$ln=14,r=8,p=1$...``), so token lists split only before the next hash."""


def _split_list(field: str, value: str) -> list[str]:
    return _HASH_START.split(value) if field == "tokens" else value.split(",")


COLLECT_PORT = "COLLECT_PORT"
COLLECT_ADMIN_PORT = "COLLECT_ADMIN_PORT"


def _port_from(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) > 65535:
        raise ConfigError(f"{name}: {value!r} is not a port number (0..65535)")
    return int(value)


def _apply_collect_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    """OndatraSQL's daemon ports: ``COLLECT_PORT`` is the ingestor's HTTP port and
    ``COLLECT_ADMIN_PORT`` the admin API's; without the latter, ``COLLECT_PORT + 1`` is the
    admin port unless the file names one (OndatraSQL's own default).

    Why here, below the ``ICEFLOE_*`` names: an OndatraSQL user's environment keeps
    working unchanged (it beats the file, as any environment does), while the
    ``ICEFLOE_INGESTOR_HTTP_PORT`` / ``ICEFLOE_ADMIN_PORT`` a deployment sets on purpose,
    and the flags, still win."""
    public = _port_from(env, COLLECT_PORT)
    admin = _port_from(env, COLLECT_ADMIN_PORT)
    if public is not None:
        raw.setdefault("ingestor", {})["http_port"] = public
        if admin is None and "port" not in raw.get("admin", {}):
            raw.setdefault("admin", {})["port"] = public + 1 if public else 0
    if admin is not None:
        raw.setdefault("admin", {})["port"] = admin


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], where: str) -> None:
    sections = {"store": StoreSection, "catalog": CatalogSection,
                "manifest": ManifestSection, "ingestor": IngestorSection,
                "collector": CollectorSection, "admin": AdminSection,
                "query": QuerySection, "otlp": OtlpSection}
    for section, struct in sections.items():
        for field in struct.__struct_fields__:
            name = f"ICEFLOE_{section.upper()}_{field.upper()}"
            if name in env and field not in FILE_ONLY:
                value: Any = env[name]
                if field in _LIST_FIELDS:
                    value = [v.strip() for v in _split_list(field, value) if v.strip()]
                raw.setdefault(section, {})[field] = value


def _resolve(url: str, base: Path) -> str:
    """``file://relative/x`` → ``file:///abs/x`` against the config folder."""
    if url.startswith("file://") and not url.startswith("file:///"):
        return (base / url[len("file://"):]).resolve().as_uri()
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "sqlite:///" + str((base / url[len("sqlite:///"):]).resolve())
    return url


def _resolve_file(path: str | None, base: Path) -> str | None:
    """A relative file path (TLS files) against the config folder.

    Symlinks are deliberately *not* resolved: a Kubernetes secret volume rotates a
    certificate by swapping a symlink, and the reloader must keep following the name.
    """
    return None if not path else os.path.normpath(base / path)


def _resolve_paths(config: Config, base: Path, source: str | None) -> Config:
    store = msgspec.structs.replace(
        config.store, url=_resolve(config.store.url, base),
        control_url=_resolve(config.store.control_url, base) if config.store.control_url
        else None)
    catalog = msgspec.structs.replace(config.catalog, uri=_resolve(config.catalog.uri, base),
                                      warehouse=_resolve(config.catalog.warehouse, base))
    ing = config.ingestor
    ingestor = msgspec.structs.replace(
        ing, tls_cert_file=_resolve_file(ing.tls_cert_file, base),
        tls_key_file=_resolve_file(ing.tls_key_file, base),
        tls_client_ca_file=_resolve_file(ing.tls_client_ca_file, base))
    col = config.collector
    collector = msgspec.structs.replace(
        col, models_dir=_resolve_file(col.models_dir, base) or "",
        tls_cert_file=_resolve_file(col.tls_cert_file, base),
        tls_key_file=_resolve_file(col.tls_key_file, base),
        tls_client_ca_file=_resolve_file(col.tls_client_ca_file, base))
    adm = config.admin
    admin = msgspec.structs.replace(
        adm, tls_cert_file=_resolve_file(adm.tls_cert_file, base),
        tls_key_file=_resolve_file(adm.tls_key_file, base),
        tls_client_ca_file=_resolve_file(adm.tls_client_ca_file, base))
    return msgspec.structs.replace(config, store=store, catalog=catalog, ingestor=ingestor,
                                   collector=collector, admin=admin, source=source)
