"""TLS settings of the ingest clients: which CA to trust and, for mutual TLS, who we are.

Why a small value object: the HTTP client (httpx, an ``ssl.SSLContext``) and the gRPC
client (``grpc.ChannelCredentials``, PEM bytes) spell the same three files differently;
one object built from paths gives both, and checks its input where it is built.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ClientTls:
    """``ca_file``: PEM bundle of the CAs to trust (default: the system's). ``cert_file`` and
    ``key_file``: this client's certificate and key, for ingestors that require mutual TLS.
    Immutable, so one instance may serve many clients and threads.

    Raises:
        ValueError: only one of ``cert_file`` and ``key_file`` is given.
    """

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("ClientTls: give cert_file and key_file together (mutual TLS)")

    def ssl_context(self) -> ssl.SSLContext:
        """For httpx: verifies the server (hostname included), presents our certificate."""
        context = ssl.create_default_context(
            cafile=None if self.ca_file is None else str(self.ca_file))
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """For a gRPC channel (files are read now, once)."""
        def read(path: str | Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))
