"""Builders for the security tests: a throwaway PKI and a real ingestor (``serve``) in-loop.

The certificates are made here with ``cryptography`` (EC P-256, one day), so the tests need
no files and can rotate certificates while a server runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from icefloe.config import Config
from ingestor.server import BoundPorts, serve


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Authority:
    """A CA that signs server and client certificates into ``folder``."""

    name: str
    folder: Path
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, folder: Path, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        authority = cls(name, folder, key, cert)
        authority.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return authority

    @property
    def ca_file(self) -> Path:
        return self.folder / f"{self.name}-ca.pem"

    def issue(self, common_name: str, *, server: bool) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for ``localhost``/``127.0.0.1`` or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder().subject_name(_name(common_name))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    def write(self, common_name: str, *, server: bool, stem: str | None = None
              ) -> tuple[Path, Path]:
        """Issue and write ``<stem>.pem`` / ``<stem>.key``; returns (cert file, key file)."""
        cert, key = self.issue(common_name, server=server)
        stem = stem or common_name
        cert_file, key_file = self.folder / f"{stem}.pem", self.folder / f"{stem}.key"
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        key_file.chmod(0o600)
        return cert_file, key_file


@contextlib.asynccontextmanager
async def ingestor(config: Config, **options: Any) -> AsyncIterator[BoundPorts]:
    """The real ingestor (:func:`ingestor.server.serve`) in this loop; yields its ports.

    ``options`` go to ``serve`` (e.g. ``tls_reload_s``). The SIGINT/SIGTERM handlers it
    installs are removed again afterwards.
    """
    ready: asyncio.Future[BoundPorts] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, on_ready=ready.set_result, **options))
    try:
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            task.result()  # raises why it did not start
            raise RuntimeError("the ingestor stopped before it was ready")
        yield ready.result()
    finally:
        stop.set()
        await task
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
