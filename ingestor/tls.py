"""The ingestor's TLS: :mod:`icefloe.server_tls` (shared with the admin API and the
collector's probes) plus the ingestor's own transport policy, :func:`server_tls`."""

from __future__ import annotations

from icefloe.config import Config
from icefloe.errors import ConfigError
from icefloe.server_tls import (
    LOOPBACK_NAMES,
    RELOAD_CHECK_S,
    CertificateReloader,
    EncryptedKey,
    ReloadingContext,
    TlsFiles,
    TlsFilesChanging,
    TlsMaterial,
    build_context,
    is_loopback,
    load_material,
    section_tls,
)

__all__ = ["LOOPBACK_NAMES", "RELOAD_CHECK_S", "CertificateReloader", "EncryptedKey",
           "ReloadingContext", "TlsFiles", "TlsFilesChanging", "TlsMaterial", "build_context",
           "is_loopback", "load_material", "section_tls", "server_tls"]


def server_tls(config: Config, interval_s: float = RELOAD_CHECK_S
               ) -> CertificateReloader | None:
    """TLS for this ingestor, or None for plaintext where the policy allows it. The rule
    covers every port the ingestor serves: HTTP, gRPC, Kafka and the OTLP ports.

    Raises:
        ConfigError: a non-loopback address without TLS and without ``plaintext = true``,
            or TLS files that cannot be loaded.
    """
    extra = _extra_ports(config)
    if not extra:
        return section_tls(config, "ingestor", interval_s,
                           what="HTTP and gRPC", secrets="tokens and events")
    names = ", ".join(f"the {name} port ({port}, {key})" for name, port, key in extra)
    kafka = any(name == "Kafka" for name, _, _ in extra)
    try:
        return section_tls(config, "ingestor", interval_s,
                           what=f"HTTP, gRPC and {names}",
                           secrets="tokens (Kafka's SASL/PLAIN passwords) and events" if kafka
                           else "tokens and events")
    except ConfigError as exc:  # the extra ports share the rule: say so where it bites
        ing = config.ingestor
        if (ing.tls_cert_file and ing.tls_key_file) or ing.plaintext:
            raise  # not the plaintext refusal (e.g. TLS files that do not load)
        why = ": its SASL/PLAIN passwords are stream tokens" if kafka \
            else ": exporters send stream tokens in their Authorization header"
        raise ConfigError(f"{exc}. The rule covers {names} too{why}") from None


def _extra_ports(config: Config) -> list[tuple[str, int, str]]:
    """The ports besides HTTP and gRPC this ingestor serves: (name, port, config key)."""
    ing = config.ingestor
    ports = [("Kafka", ing.kafka_port, "kafka_port"),
             ("OTLP/HTTP", ing.otlp_http_port, "otlp_http_port"),
             ("OTLP/gRPC", ing.otlp_grpc_port, "otlp_grpc_port")]
    return [(name, port, key) for name, port, key in ports if port is not None]
