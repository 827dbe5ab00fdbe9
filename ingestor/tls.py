"""The ingestor's TLS: :mod:`icefloe.server_tls` (shared with the admin API and the
collector's probes) plus the ingestor's own transport policy, :func:`server_tls`."""

from __future__ import annotations

from icefloe.config import Config
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
    return section_tls(config, "ingestor", interval_s,
                       what="HTTP and gRPC", secrets="tokens and events")
