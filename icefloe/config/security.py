"""Load-time checks of the security settings: tokens, TLS files, proxies, limits, timeouts.

Why at load time: a plain-text token, a key without a certificate or a misspelt CIDR must
stop every process at start with the key that is wrong, not surface as a 401 storm or an
open port later. Whether the ingestor may serve without TLS depends on the address it binds
(flags may change it), so that policy is checked when the ingestor starts
(:func:`ingestor.tls.server_tls`), not here. Messages name keys, never token values.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING

from icefloe.errors import ConfigError
from icefloe.tokens import TokenHashError, looks_hashed, parse_hash

if TYPE_CHECKING:
    from icefloe.config.model import Config, IngestorSection
    from icefloe.streams.model import RateLimit

ALL_STREAMS = "*"
FORWARDED_HEADERS = ("x-forwarded-for", "forwarded")
"""The values of ``[ingestor] forwarded_header``."""
_TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PLAIN_TOKEN_ADVICE = ("icefloe keeps only salted hashes of tokens: run `icefloe token hash` "
                      "(it reads the token on stdin; `icefloe token new` makes one) and paste "
                      "the line it prints instead")


def validate_security(config: Config, where: str) -> None:
    """Every security rule; raises :class:`ConfigError` naming the first wrong key."""
    _validate_transport(config.ingestor, f"{where}: ingestor")
    for position, entry in enumerate(config.otlp.tokens):  # named before the streams it is in
        check_hash(entry, f"{where}: otlp.tokens[{position}]")
    if config.otlp.rate_limit is not None:
        validate_rate_limit(config.otlp.rate_limit, f"{where}: otlp.rate_limit")
    for index, stream in enumerate(config.streams):
        at = f"{where}: streams[{index}]"
        for position, entry in enumerate(stream.tokens):
            check_hash(entry, f"{at}.tokens[{position}]")
        if stream.rate_limit is not None:
            validate_rate_limit(stream.rate_limit, f"{at}.rate_limit")
    _validate_tokens(config, where)


def needs_token(config: Config, stream: str) -> bool:
    """Whether writes to ``stream`` need a token: it has its own ``tokens``, or some
    ``[[tokens]]`` entry names it or ``"*"``. Only streams no token is valid for are open."""
    own = config.stream(stream)
    if own is not None and own.tokens:
        return True
    return any(ALL_STREAMS in t.streams or stream in t.streams for t in config.tokens)


def check_hash(entry: str, at: str) -> None:
    """A token entry must be a hash line; a plain token gets advice, never an echo."""
    if not looks_hashed(entry):
        raise ConfigError(f"{at}: not a token hash; {PLAIN_TOKEN_ADVICE}")
    try:
        parse_hash(entry)
    except TokenHashError as exc:
        raise ConfigError(f"{at}: {exc}") from None


def validate_rate_limit(limit: RateLimit, at: str) -> None:
    if limit.events_per_s is None and limit.bytes_per_s is None:
        raise ConfigError(f"{at}: set events_per_s, bytes_per_s or both")
    for key in ("events_per_s", "bytes_per_s", "burst_s"):
        value = getattr(limit, key)
        if value is not None and not value > 0:
            raise ConfigError(f"{at}.{key} must be > 0")


def _validate_transport(ing: IngestorSection, at: str) -> None:
    if bool(ing.tls_cert_file) != bool(ing.tls_key_file):
        missing = "tls_key_file" if ing.tls_cert_file else "tls_cert_file"
        raise ConfigError(f"{at}.{missing}: TLS needs both tls_cert_file and tls_key_file")
    if ing.tls_client_ca_file and not ing.tls_cert_file:
        raise ConfigError(f"{at}.tls_client_ca_file: mutual TLS needs TLS first: set "
                          "tls_cert_file and tls_key_file too")
    if ing.plaintext and ing.tls_cert_file:
        raise ConfigError(f"{at}.plaintext: true contradicts tls_cert_file (TLS is on); "
                          "remove one of them")
    if ing.forwarded_header not in FORWARDED_HEADERS:
        raise ConfigError(f"{at}.forwarded_header: {ing.forwarded_header!r} is not one of "
                          f"{', '.join(map(repr, FORWARDED_HEADERS))} (the header your "
                          "trusted proxies set; lower case)")
    for index, proxy in enumerate(ing.trusted_proxies):
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(f"{at}.trusted_proxies[{index}]: {proxy!r} is not an IP "
                              "address or CIDR (e.g. '10.0.0.0/8', '127.0.0.1')") from None
    for key in ("keep_alive_s", "header_timeout_s", "body_timeout_s",
                "grpc_max_streams_per_connection"):
        if not getattr(ing, key) > 0:
            raise ConfigError(f"{at}.{key} must be > 0")
    if ing.body_min_bytes_per_s < 0:
        raise ConfigError(f"{at}.body_min_bytes_per_s must be >= 0 (0: the whole body "
                          "within body_timeout_s)")
    if ing.client_rate_limit is not None:
        validate_rate_limit(ing.client_rate_limit, f"{at}.client_rate_limit")
    _validate_grpc_lifetimes(ing, at)


GRPC_DURATIONS = ("grpc_keepalive_time_s", "grpc_keepalive_timeout_s",
                  "grpc_min_ping_interval_s", "grpc_max_connection_idle_s",
                  "grpc_max_connection_age_s", "grpc_max_connection_age_grace_s",
                  "grpc_stream_idle_s")
"""The gRPC connection and stream lifetimes (seconds, each > 0)."""


def _validate_grpc_lifetimes(ing: IngestorSection, at: str) -> None:
    """gRPC keepalive, ping, idle and age limits; pairs that defeat each other are refused
    with both keys named."""
    for key in GRPC_DURATIONS:
        if not getattr(ing, key) > 0:
            raise ConfigError(f"{at}.{key} must be > 0")
    if ing.grpc_max_ping_strikes < 1:
        raise ConfigError(f"{at}.grpc_max_ping_strikes must be >= 1")
    if ing.grpc_keepalive_timeout_s >= ing.grpc_keepalive_time_s:
        raise ConfigError(
            f"{at}.grpc_keepalive_timeout_s ({ing.grpc_keepalive_timeout_s:g}) must be less "
            f"than ingestor.grpc_keepalive_time_s ({ing.grpc_keepalive_time_s:g}): the next "
            "keepalive ping would be due before the last one could time out")
    if ing.grpc_max_connection_age_grace_s < ing.flush_timeout_s:
        raise ConfigError(
            f"{at}.grpc_max_connection_age_grace_s ({ing.grpc_max_connection_age_grace_s:g})"
            f" must be at least ingestor.flush_timeout_s ({ing.flush_timeout_s:g}): a call "
            "waiting for its flush when its connection reaches its age would be cut before "
            "its answer, and its client would resend events already stored")


def _validate_tokens(config: Config, where: str) -> None:
    streams = {s.name for s in config.streams}
    names: set[str] = set()
    for index, token in enumerate(config.tokens):
        at = f"{where}: tokens[{index}]"
        if not _TOKEN_NAME.fullmatch(token.name):
            raise ConfigError(f"{at}.name: {token.name!r} must be 1-64 letters, digits, '_', "
                              "'-' or '.' (it appears in logs and metrics)")
        if token.name in names:
            raise ConfigError(f"{at}.name: duplicate token name {token.name!r}")
        names.add(token.name)
        check_hash(token.hash, f"{at}.hash")
        if not token.streams:
            raise ConfigError(f"{at}.streams: name the streams this token may write to "
                              f"(or [\"{ALL_STREAMS}\"] for all)")
        if ALL_STREAMS in token.streams and len(token.streams) > 1:
            raise ConfigError(f"{at}.streams: \"{ALL_STREAMS}\" already means every stream")
        for position, name in enumerate(token.streams):
            if name != ALL_STREAMS and name not in streams:
                raise ConfigError(f"{at}.streams[{position}]: unknown stream {name!r}")
        if token.rate_limit is not None:
            validate_rate_limit(token.rate_limit, f"{at}.rate_limit")
