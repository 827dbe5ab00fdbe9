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
    """TLS for this ingestor, or None for plaintext where the policy allows it.

    Raises:
        ConfigError: a non-loopback address without TLS and without ``plaintext = true``,
            or TLS files that cannot be loaded.
    """
    kafka = config.ingestor.kafka_port
    if kafka is None:
        return section_tls(config, "ingestor", interval_s,
                           what="HTTP and gRPC", secrets="tokens and events")
    try:
        return section_tls(config, "ingestor", interval_s,
                           what=f"HTTP, gRPC and Kafka (port {kafka})",
                           secrets="tokens (Kafka's SASL/PLAIN passwords) and events")
    except ConfigError as exc:  # the Kafka port shares the rule: say so where it bites
        ing = config.ingestor
        if (ing.tls_cert_file and ing.tls_key_file) or ing.plaintext:
            raise  # not the plaintext refusal (e.g. TLS files that do not load)
        raise ConfigError(f"{exc}. The rule covers the Kafka port ({kafka}, kafka_port) "
                          "too: its SASL/PLAIN passwords are stream tokens") from None
