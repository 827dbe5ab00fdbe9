"""Open the Iceberg catalog named by ``[catalog]``: SQL (SQLite/PostgreSQL), Glue or REST.

Why a wrapper around pyiceberg's constructors: each catalog fails in its own way (SQLAlchemy
``OperationalError``, botocore ``EndpointConnectionError``, pyiceberg ``RESTError``), some only
on first use, and some messages carry the connection URI with its password. Here every
failure becomes one :class:`CatalogError` line that names the catalog (password masked) and
says what to check, and the catalog is probed once, so a wrong endpoint stops the process
at start instead of at its first commit.

Drivers: SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3, which icefloe does not
install (pyiceberg's ``sql-postgres`` extra brings psycopg2), so the scheme is pinned to an
installed driver. The REST catalog is tested against a small test server
(``tests/rest_catalog_server.py``), not a production one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from pyiceberg.catalog import Catalog

from icefloe.config import CatalogSection
from icefloe.errors import CatalogError, ConfigError
from icefloe.redact import SECRET_QUERY_KEYS, mask_uri

_PG_CONNECT_TIMEOUT_S = "10"
_GLUE_MAX_RETRIES = "glue.max-retries"

__all__ = ["catalog_label", "mask_uri", "open_catalog"]


def catalog_label(section: CatalogSection) -> str:
    """A log-safe one-line name of the catalog: type, name and where it is (no secrets)."""
    if section.type == "glue":
        endpoint = section.properties.get("glue.endpoint", "the AWS endpoint")
        region = section.properties.get("glue.region", "default region")
        return f"glue catalog {section.name!r} at {endpoint} ({region})"
    return f"{section.type} catalog {section.name!r} at {mask_uri(section.uri)}"


def open_catalog(section: CatalogSection) -> Catalog:
    """Build the catalog and probe it once; any failure is a :class:`CatalogError`."""
    label = catalog_label(section)
    try:
        if section.type == "sql":
            catalog = _open_sql(section)
        elif section.type == "glue":
            catalog = _open_glue(section)
        elif section.type == "rest":
            catalog = _open_rest(section)
        else:
            raise CatalogError(f"catalog.type: unknown catalog type {section.type!r} "
                               "(expected sql, glue or rest)")
        # Glue and SQL constructors may not touch the service: one cheap call proves it is
        # reachable with these credentials before anything depends on it.
        catalog.list_namespaces()
        return catalog
    except (CatalogError, ConfigError):
        raise
    except Exception as exc:  # every driver has its own error tree: translate them all here
        reason = _secret_free(_one_line(exc), section)
        raise CatalogError(f"cannot open {label}: {reason}; {_advice(section)}") from exc


def _open_sql(section: CatalogSection) -> Catalog:
    from pyiceberg.catalog.sql import SqlCatalog  # lazy: sqlalchemy

    uri = section.uri
    if uri.startswith("sqlite:") and ":///" in uri:
        path = uri.split(":///", 1)[1].split("?", 1)[0]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    elif uri.startswith(("postgresql:", "postgres:", "postgresql+")):
        uri = _postgres_uri(uri)
    _prepare_warehouse(section.warehouse)
    return SqlCatalog(section.name, **{**section.properties, "uri": uri,
                                       "warehouse": section.warehouse})


def _open_glue(section: CatalogSection) -> Catalog:
    from pyiceberg.catalog.glue import GlueCatalog  # lazy: boto3

    _prepare_warehouse(section.warehouse)
    props: dict[str, object] = {**section.properties, "warehouse": section.warehouse}
    if _GLUE_MAX_RETRIES in props:
        # Config properties are strings; botocore compares the retry count with numbers.
        props[_GLUE_MAX_RETRIES] = _glue_max_retries(section.properties[_GLUE_MAX_RETRIES])
    return GlueCatalog(section.name, **props)


def _glue_max_retries(value: str) -> int:
    try:
        retries = int(value)
    except ValueError:
        retries = -1
    if retries < 0:
        raise ConfigError(f"catalog.properties {_GLUE_MAX_RETRIES} must be a whole number "
                          f">= 0, got {value!r}")
    return retries


def _open_rest(section: CatalogSection) -> Catalog:
    from pyiceberg.catalog.rest import RestCatalog  # lazy: requests

    return RestCatalog(section.name, **{**section.properties, "uri": section.uri,
                                        "warehouse": section.warehouse})


def _postgres_uri(uri: str) -> str:
    """Pin a bare ``postgres(ql)://`` to an installed driver and bound the connect time.

    Without ``connect_timeout`` libpq waits for the OS TCP timeout (minutes) on a host that
    drops packets, so a wrong address would look like a hang.
    """
    scheme, rest = uri.split("://", 1)
    if "+" not in scheme:
        driver = "psycopg2" if importlib.util.find_spec("psycopg2") else "psycopg"
        scheme = f"postgresql+{driver}"
    query = rest.split("?", 1)[1] if "?" in rest else ""
    if "connect_timeout" not in dict(parse_qsl(query)):
        rest += ("&" if "?" in rest else "?") + f"connect_timeout={_PG_CONNECT_TIMEOUT_S}"
    return f"{scheme}://{rest}"


def _prepare_warehouse(warehouse: str) -> None:
    """A ``file://`` warehouse must exist before pyiceberg writes its first metadata file."""
    if warehouse.startswith("file://"):
        parts = urlsplit(warehouse)  # file://./rel keeps "." as host: relative to the cwd
        host = "" if parts.netloc in ("", "localhost") else parts.netloc
        Path(unquote(host + parts.path)).mkdir(parents=True, exist_ok=True)
    elif "://" not in warehouse and warehouse:
        Path(warehouse).mkdir(parents=True, exist_ok=True)


def _advice(section: CatalogSection) -> str:
    if section.type == "glue":
        return ("check catalog.properties glue.endpoint / glue.region and the AWS credentials "
                "(environment or glue.access-key-id / glue.secret-access-key)")
    if section.type == "rest":
        return "check that the REST catalog runs at catalog.uri and its credentials"
    if section.uri.startswith("sqlite:"):
        return "check that catalog.uri points to a writable file"
    if section.uri.startswith(("postgresql", "postgres:")):
        return ("check that PostgreSQL is running and that catalog.uri (host, port, user, "
                "password, database) is right")
    return "check catalog.uri (sqlite:///path or postgresql://user:password@host/db)"


def _one_line(exc: BaseException) -> str:
    """First meaningful lines of an error, minus SQLAlchemy's 'Background on this error' link."""
    text = str(exc).split("(Background on this error", 1)[0]
    text = " ".join(text.split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def _secret_free(text: str, section: CatalogSection) -> str:
    password = urlsplit(section.uri).password if "://" in section.uri else None
    for secret in (password, *(v for k, v in section.properties.items() if _is_secret(k))):
        if secret:
            text = text.replace(secret, "***")
    return text


def _is_secret(key: str) -> bool:
    return any(word in key.lower() for word in SECRET_QUERY_KEYS)
