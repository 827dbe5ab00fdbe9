"""TLS for icefloe's servers (ingestor, admin API, collector probes), reloaded from files.

Shared by every part that listens (the core holds it so the collector needs no ingestor
import); :mod:`ingestor.tls` re-exports it with the ingestor's own policy call.

Why reload: certificates are short-lived (ACME, cert-manager, Vault rotate them every few
weeks or hours) and an ingestor restart costs its buffer a drain. A watcher looks at the
files every ``interval_s`` (5 s); when one changed it builds a *new* context from them and
only then swaps it in, so a half-written or mismatched pair is refused with a warning and
the old certificate keeps serving. Connections already open keep the certificate they
shook hands with; new handshakes get the new one.

* HTTP: uvicorn gets a :class:`ReloadingContext`, an ``SSLContext`` whose ``wrap_bio`` hands
  every new connection to the current inner context (asyncio and uvloop both create the
  per-connection TLS object through ``wrap_bio``; a threaded server's ``wrap_socket`` does
  the same). Swapping the inner context is atomic, and it carries the client CA too,
  which ``load_cert_chain`` on a live context could not take back.
* gRPC: ``grpc.dynamic_ssl_server_credentials`` with a fetcher gRPC calls on each new
  connection; it hands over the new PEM bytes once per change.

Mutual TLS: with ``tls_client_ca_file`` every client must present a certificate that CA
signed (HTTP ``CERT_REQUIRED``; gRPC ``require_client_authentication``).

The plaintext policy (:func:`section_tls`, the same for each section): loopback addresses
may serve without TLS; any other address needs TLS or an explicit ``plaintext = true`` in
that section (then a warning at start), because tokens, events, metrics and health would
otherwise cross the network in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from icefloe.errors import ConfigError

if TYPE_CHECKING:
    from icefloe.config import Config

log = logging.getLogger("icefloe.ingestor.tls")
"""One logger name for every server's TLS (operators' filters predate the move here)."""

RELOAD_CHECK_S = 5.0
"""How often the certificate files are looked at (a stat each, nothing more)."""
LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files: certificate chain, private key and, for mTLS, the client CA bundle."""

    cert: str
    key: str
    client_ca: str | None = None

    def paths(self) -> list[tuple[str, str]]:
        named = [("tls_cert_file", self.cert), ("tls_key_file", self.key)]
        if self.client_ca:
            named.append(("tls_client_ca_file", self.client_ca))
        return named

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What changes when a file is replaced or rewritten (stat follows symlinks, so a
        Kubernetes secret's ``..data`` swap counts)."""
        stamps = []
        for _, path in self.paths():
            info = os.stat(path)
            stamps.append((info.st_mtime_ns, info.st_size, info.st_ino))
        return tuple(stamps)


@dataclass(frozen=True)
class TlsMaterial:
    """One consistent load of the files: the PEM bytes (for gRPC) and a built context."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    context: ssl.SSLContext


def build_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context from the files: TLS 1.2+, HTTP/1.1 ALPN, client certs if mTLS."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert, files.key, password=_encrypted_key)
    context.set_alpn_protocols(["http/1.1"])
    if files.client_ca:
        context.load_verify_locations(cafile=files.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class EncryptedKey(Exception):
    """The private key needs a passphrase (icefloe takes unencrypted keys only)."""


def _encrypted_key() -> bytes:
    """Asked for by OpenSSL only for an encrypted key: refuse, rather than let OpenSSL prompt
    on the terminal (blocking the event loop during a reload) or fail with EINVAL."""
    raise EncryptedKey


def _read(files: TlsFiles, section: str) -> tuple[bytes, ...]:
    out = []
    for key, path in files.paths():
        try:
            with open(path, "rb") as handle:
                out.append(handle.read())
        except OSError as exc:
            raise ConfigError(f"{section}.{key}: cannot read {path}: {exc.strerror}") from None
    return tuple(out)


def load_material(files: TlsFiles, section: str = "ingestor") -> TlsMaterial:
    """Read the files and build a context from the very same bytes.

    Raises:
        ConfigError: a file is unreadable, not PEM, or the key does not match.
        TlsFilesChanging: the files changed while being read (try again shortly).
    """
    before = _read(files, section)
    try:
        context = build_context(files)
    except EncryptedKey:
        raise ConfigError(f"{section}.tls_key_file ({files.key}): the private key is encrypted; "
                          "give an unencrypted key (keep it 0600)") from None
    except ssl.SSLError as exc:
        raise ConfigError(f"{section}.tls_cert_file/tls_key_file ({files.cert}, {files.key}"
                          f"{', ' + files.client_ca if files.client_ca else ''}): cannot "
                          f"load them: {exc.reason or exc}") from None
    except OSError as exc:
        raise ConfigError(f"{section} TLS files: {exc.strerror}: {exc.filename}") from None
    if _read(files, section) != before:
        raise TlsFilesChanging("the certificate files changed while they were read")
    return TlsMaterial(before[0], before[1], before[2] if files.client_ca else None, context)


class TlsFilesChanging(Exception):
    """A rotation is being written right now; the next check will see the finished files."""


class ReloadingContext(ssl.SSLContext):
    """An ``SSLContext`` that hands each new connection to ``current`` (swappable)."""

    current: ssl.SSLContext

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self.current.wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        return self.current.wrap_socket(*args, **kwargs)


class CertificateReloader:
    """Serves the current certificate to HTTP and gRPC and reloads it when files change.

    ``check()`` runs on the event loop (the watcher task); gRPC's fetcher runs on a gRPC
    thread and only reads ``generation`` and ``material``, which ``check`` replaces whole.
    """

    def __init__(self, files: TlsFiles, interval_s: float = RELOAD_CHECK_S,
                 section: str = "ingestor") -> None:
        self.files = files
        self.interval_s = interval_s
        self.section = section
        self.material = load_material(files, section)
        self.stamp = files.stamp()
        self.generation = 1
        self.reloads = 0
        self.http_context = ReloadingContext(ssl.PROTOCOL_TLS_SERVER)
        self.http_context.current = self.material.context
        self._grpc_generation = 1
        self._task: asyncio.Task[None] | None = None

    @property
    def mutual(self) -> bool:
        return self.files.client_ca is not None

    def check(self) -> bool:
        """Reload if the files changed; True if a new certificate now serves."""
        try:
            stamp = self.files.stamp()
        except OSError as exc:
            log.warning("TLS files unreadable (%s: %s); still serving the last certificate",
                        exc.filename, exc.strerror)
            return False
        if stamp == self.stamp:
            return False
        try:
            material = load_material(self.files, self.section)
        except TlsFilesChanging:
            return False  # not recorded: the next check tries again
        except ConfigError as exc:
            self.stamp = stamp  # do not retry a broken pair every few seconds
            log.warning("TLS files changed but cannot be used (%s); still serving the last "
                        "certificate", exc)
            return False
        self.stamp = stamp
        self.material = material
        self.http_context.current = material.context
        self.generation += 1
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.files.cert)
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.check()

    def start(self) -> None:
        """Start watching the files (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.watch(),
                                                                name="tls-reloader")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- gRPC -------------------------------------------------------------------------------

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(self.material), self._fetch,
            require_client_authentication=self.mutual)

    @staticmethod
    def _grpc_config(material: TlsMaterial) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.cert)], root_certificates=material.client_ca)

    def _fetch(self) -> Any:
        """gRPC asks on every new connection: a new configuration once per reload."""
        generation = self.generation
        if generation == self._grpc_generation:
            return None
        self._grpc_generation = generation
        return self._grpc_config(self.material)


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def section_tls(config: Config, section: str, interval_s: float = RELOAD_CHECK_S, *,
                what: str, secrets: str) -> CertificateReloader | None:
    """The plaintext policy for one config section with ``host``, ``tls_*`` files and
    ``plaintext`` (``[ingestor]``, ``[admin]``, ``[collector]``)."""
    part = getattr(config, section)
    if part.tls_cert_file and part.tls_key_file:
        return CertificateReloader(TlsFiles(part.tls_cert_file, part.tls_key_file,
                                            part.tls_client_ca_file), interval_s, section)
    if is_loopback(part.host):
        return None
    where = config.source or "config"
    if not part.plaintext:
        raise ConfigError(
            f"{where}: {section}.plaintext: refusing to serve {part.host or 'every address'} "
            f"without TLS; set {section}.tls_cert_file and {section}.tls_key_file, or set "
            f"plaintext = true in [{section}] when a gateway in front terminates TLS, or "
            "bind 127.0.0.1 (--host)")
    log.warning("serving plaintext %s on %s (%s.plaintext = true): %s are unencrypted up "
                "to the TLS-terminating gateway", what, part.host or "every address",
                section, secrets)
    return None
