"""Loading ``icefloe.toml``: find the file, merge flag > environment > file > default,
resolve relative paths, validate.

Environment names are ``ICEFLOE_<SECTION>_<KEY>`` (e.g. ``ICEFLOE_INGESTOR_HTTP_PORT``,
``ICEFLOE_STORE_URL``); OndatraSQL's ``COLLECT_PORT`` / ``COLLECT_ADMIN_PORT`` are read too
(:func:`_apply_collect_env`). An environment value is parsed strictly by its setting's type
(:func:`_env_value`), and an ``ICEFLOE_<SECTION>_<KEY>`` that sets nothing is refused; the
file's values must have their types already (no ``"8080"`` for a port). Relative ``file:``
paths, SQLite paths and TLS files resolve against the config file's folder. Every failure
is a :class:`ConfigError` naming the file and the key (or the variable), never a stack trace
from deep inside a server.
"""

from __future__ import annotations

import difflib
import math
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
            raw = tomllib.loads(source.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{source}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read config file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start} is "
                              f"{exc.object[exc.start]:#04x}); TOML files are UTF-8: save it "
                              "as UTF-8") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    origins: dict[str, str] = {}
    _apply_collect_env(raw, env, origins)
    _apply_env(raw, env, origins)
    for section, values in (overrides or {}).items():
        given = {k: v for k, v in values.items() if v is not None}
        raw.setdefault(section, {}).update(given)
        for key in given:  # a flag beats the environment
            origins.pop(f"{section}.{key}", None)
    prepare_raw(raw, where)
    try:  # strict: the file's values are typed; the environment's were parsed above
        config = msgspec.convert(raw, Config, strict=True)
    except msgspec.ValidationError as exc:
        path, reason = split_key_path(str(exc))
        if path is not None and path in origins:
            raise ConfigError(f"{origins[path]}: {reason} (for {path})") from None
        raise ConfigError(f"{where}: {_key_path(str(exc))}{_type_hint(reason)}") from None
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
    try:
        validate(config, where)
    except ConfigError as exc:
        raise ConfigError(_blame_env(str(exc), origins)) from None
    return config


def _blame_env(message: str, origins: Mapping[str, str]) -> str:
    """A validation message about a key the environment set, with the variable named: the
    file does not hold that value, so the message must not send the reader there."""
    named = [f"{key} is {origin}" for key, origin in origins.items()
             if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message)]
    return f"{message} ({'; '.join(named)} in the environment)" if named else message


def split_key_path(message: str) -> tuple[str | None, str]:
    """msgspec says 'Expected `int`, got `str` - at `$.ingestor.http_port`': (key, reason),
    key None when the message names none."""
    if " - at `$." in message:
        reason, key = message.rsplit(" - at `$.", 1)
        return key.rstrip("`"), reason
    return None, message


_TYPE_HINTS = {
    "got `str`": "write the value without quotes: TOML gives it its type",
    "`int`, got `float`": "a whole number is written without a decimal point",
    "`bool`, got `int`": "write true or false",
}


def _type_hint(reason: str) -> str:
    """What to write instead, for the wrong types a hand-written file has most often."""
    if not reason.startswith("Expected") or "`str" in reason.split(",")[0]:
        return ""
    return next((f"; {hint}" for end, hint in _TYPE_HINTS.items() if reason.endswith(end)),
                "")


def _key_path(message: str) -> str:
    """A msgspec message led by the key it is about."""
    key, reason = split_key_path(message)
    return reason if key is None else f"{key}: {reason}"


FILE_ONLY = frozenset({"properties", "client_rate_limit", "spark_conf", "partition_by",
                       "sort_by", "table_properties", "rate_limit"})
"""Settings that are tables: set in the file only, never from the environment."""


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
    if not _ASCII_DIGITS.fullmatch(value) or int(value) > 65535:
        raise ConfigError(f"{name}: {value!r} is not a port number (0..65535)")
    return int(value)


def _apply_collect_env(raw: dict[str, Any], env: Mapping[str, str],
                       origins: dict[str, str]) -> None:
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
        origins["ingestor.http_port"] = f"{COLLECT_PORT}={public}"
        if admin is None and "port" not in raw.get("admin", {}):
            if public == 65535:
                raise ConfigError(
                    f"{COLLECT_PORT}=65535: the admin API's port would be {COLLECT_PORT} + 1 "
                    f"= 65536, not a TCP port; set {COLLECT_ADMIN_PORT} (or [admin] port), "
                    f"or a lower {COLLECT_PORT}")
            raw.setdefault("admin", {})["port"] = public + 1 if public else 0
            origins["admin.port"] = f"{COLLECT_PORT} + 1 ({COLLECT_PORT}={public})"
    if admin is not None:
        raw.setdefault("admin", {})["port"] = admin
        origins["admin.port"] = f"{COLLECT_ADMIN_PORT}={admin}"


SECTIONS: dict[str, type[msgspec.Struct]] = {
    "store": StoreSection, "catalog": CatalogSection, "manifest": ManifestSection,
    "ingestor": IngestorSection, "collector": CollectorSection, "admin": AdminSection,
    "query": QuerySection, "otlp": OtlpSection}
"""The sections ``ICEFLOE_<SECTION>_<KEY>`` can set."""

ENV_READ_ELSEWHERE = frozenset({
    "ICEFLOE_CONFIG", "ICEFLOE_DATA_DIR",  # the file and --data-dir (config_args)
    "ICEFLOE_ADMIN_TOKEN", "ICEFLOE_ADMIN_CACERT",  # admin API clients (sources_cmd)
    "ICEFLOE_COLLECTOR_URL",  # icefloe run-now's collector (run_remote)
    "ICEFLOE_STORE_FAULTS",  # fault injection (store.failpoints)
    "ICEFLOE_SPEEDUPS",  # compiled modules off (formats.speedups)
    "ICEFLOE_TOKEN",  # icefloe demo's write token
    "ICEFLOE_HEALTHCHECK_CERT_FILE", "ICEFLOE_HEALTHCHECK_KEY_FILE",  # deploy/docker
    "ICEFLOE_BUF_DIR", "ICEFLOE_CHECKOV",  # developer tools (scripts, tests)
    "ICEFLOE_DUCKDB_ICEBERG_PYTHON", "ICEFLOE_ICEBERG_JAVA_PYTHON",  # query test tools
})
"""``ICEFLOE_*`` variables other parts read: never taken for config settings. Four of them
start like a section (``ICEFLOE_ADMIN_``, ``ICEFLOE_COLLECTOR_``, ``ICEFLOE_STORE_``)."""

_ASCII_DIGITS = re.compile(r"[0-9]+")
_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_TRUE, _FALSE = ("true", "1"), ("false", "0")


def env_name(section: str, field: str) -> str:
    return f"ICEFLOE_{section.upper()}_{field.upper()}"


def _file_only(kind: Any) -> bool:
    """A table (a dict or a struct): only the file can give it."""
    kinds = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
    return any(isinstance(k, (msgspec.inspect.DictType, msgspec.inspect.StructType))
               for k in kinds)


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], origins: dict[str, str]) -> None:
    """Each ``ICEFLOE_<SECTION>_<KEY>`` parsed by its setting's type, strictly; a variable
    naming no setting (a typo, a table) is refused rather than ignored."""
    for name in sorted(env):
        if not name.startswith("ICEFLOE_") or name in ENV_READ_ELSEWHERE:
            continue
        rest = name[len("ICEFLOE_"):]
        section = next((s for s in SECTIONS if rest.startswith(s.upper() + "_")), None)
        if section is None:
            _check_stray(name)
            continue
        key = rest[len(section) + 1:]
        info = msgspec.inspect.type_info(SECTIONS[section])
        assert isinstance(info, msgspec.inspect.StructType)
        fields = {f.name: f.type for f in info.fields}
        field = key.lower()
        if field not in fields or key != field.upper():
            close = difflib.get_close_matches(field, list(fields), n=1, cutoff=0.6)
            hint = f"; did you mean {env_name(section, close[0])}?" if close else ""
            raise ConfigError(f"{name}: [{section}] has no setting {field!r}{hint} "
                              "(unset the variable if it is not meant for icefloe)")
        if field in FILE_ONLY or _file_only(fields[field]):
            raise ConfigError(f"{name}: {section}.{field} is a table and is set in the "
                              f"config file only ([{section}] {field}); unset the variable")
        raw.setdefault(section, {})[field] = _env_value(name, env[name], section, field,
                                                        fields[field])
        origins[f"{section}.{field}"] = f"{name}={env[name]!r}"


def _check_stray(name: str) -> None:
    """An ``ICEFLOE_*`` name outside the sections is left alone (other tools and scripts
    use the prefix too, see :data:`ENV_READ_ELSEWHERE`), unless it is clearly a misspelt
    section followed by one of its settings (``ICEFLOE_INGESTER_HTTP_PORT``): refused."""
    word, _, key = name[len("ICEFLOE_"):].partition("_")
    close = difflib.get_close_matches(word.lower(), list(SECTIONS), n=1, cutoff=0.75)
    if close and key.lower() in SECTIONS[close[0]].__struct_fields__:
        raise ConfigError(f"{name}: there is no section {word.lower()!r}; did you mean "
                          f"{env_name(close[0], key.lower())}? (sections: "
                          f"{', '.join(SECTIONS)})")


def _env_value(name: str, text: str, section: str, field: str, kind: Any) -> Any:
    """``text`` as the setting's type; a value that is not exactly one is refused with the
    variable, its value and what it takes."""
    mi = msgspec.inspect
    key = f"{section}.{field}"
    optional = False
    if isinstance(kind, mi.UnionType):
        kinds = [k for k in kind.types if not isinstance(k, mi.NoneType)]
        optional = len(kinds) < len(kind.types)
        kind = kinds[0] if len(kinds) == 1 else kind
    unset = ", or null to unset it" if optional else ""
    if optional and text == "null" and not isinstance(kind, mi.StrType):
        return None
    if isinstance(kind, mi.BoolType):
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"{name}={text!r}: {key} takes true or false (or 1 or 0)")
    if isinstance(kind, mi.IntType):
        if _ASCII_INT.fullmatch(text):
            return int(text)
        raise ConfigError(f"{name}={text!r}: {key} takes a whole number (digits only, no "
                          f"decimal point or exponent){unset}")
    if isinstance(kind, mi.FloatType):
        if _ASCII_FLOAT.fullmatch(text) and math.isfinite(float(text)):
            return float(text)
        raise ConfigError(f"{name}={text!r}: {key} takes a finite number such as 30 or 0.5"
                          f"{unset}")
    if isinstance(kind, (mi.VarTupleType, mi.ListType)):
        return [v.strip() for v in _split_list(field, text) if v.strip()]
    return text  # a string, or one of a Literal's strings (msgspec checks which)


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
