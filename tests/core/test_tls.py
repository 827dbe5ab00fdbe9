"""TLS and mutual TLS on a real ingestor (``serve``), with real httpx and gRPC clients.

Certificates are made per test (:mod:`security_support`); the reload tests rewrite them
while the server runs and expect new handshakes to see the new certificate.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import httpx
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from ingest_support import PAGEVIEWS, make_config
from security_support import Authority, ingestor

from icefloe.client import AsyncGrpcClient, AsyncHttpClient, ClientTls, IngestRejected
from icefloe.config import Config
from icefloe.errors import ConfigError
from ingestor.tls import server_tls

EVENT = {"user_id": "u1", "url": "/"}
FAST_RELOAD_S = 0.05


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Authority]:
    return {name: Authority.create(tmp_path, name) for name in ("main", "other")}


def tls_config(tmp_path: Path, pki: dict[str, Authority], *, mutual: bool = False,
               **ingestor_settings: object) -> Config:
    cert, key = pki["main"].write("server", server=True)
    return make_config(tmp_path / "store", (PAGEVIEWS,), tls_cert_file=str(cert),
                       tls_key_file=str(key),
                       tls_client_ca_file=str(pki["main"].ca_file) if mutual else None,
                       **ingestor_settings)


async def http_send(port: int, tls: ClientTls | None, scheme: str = "https") -> int:
    async with AsyncHttpClient(f"{scheme}://127.0.0.1:{port}", retries=0, tls=tls,
                               timeout=5) as client:
        return await client.send("pageviews", [EVENT])


async def grpc_send(port: int, tls: ClientTls | None) -> int:
    async with AsyncGrpcClient(f"localhost:{port}", retries=0, tls=tls, timeout=5) as client:
        return await client.publish("pageviews", [EVENT])


async def refused(call: Awaitable[int]) -> IngestRejected:
    with pytest.raises(IngestRejected) as info:
        await call
    return info.value


# -- handshakes --------------------------------------------------------------------------------

async def test_should_serve_http_and_grpc_over_tls(tmp_path, pki):
    async with ingestor(tls_config(tmp_path, pki)) as ports:
        trust = ClientTls(ca_file=pki["main"].ca_file)
        assert await http_send(ports.http, trust) == 1
        assert await grpc_send(ports.grpc, trust) == 1
        async with httpx.AsyncClient(verify=trust.ssl_context()) as client:
            health = await client.get(f"https://localhost:{ports.http}/healthz")
        assert health.status_code == 200
        assert health.extensions["http_version"] == b"HTTP/1.1"


async def test_should_refuse_plaintext_clients_on_a_tls_server(tmp_path, pki):
    async with ingestor(tls_config(tmp_path, pki)) as ports:
        http = await refused(http_send(ports.http, None, scheme="http"))
        assert http.status is None
        assert http.code == "connection_failed"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_should_refuse_clients_that_do_not_trust_the_server(tmp_path, pki):
    async with ingestor(tls_config(tmp_path, pki)) as ports:
        wrong = ClientTls(ca_file=pki["other"].ca_file)
        assert (await refused(http_send(ports.http, wrong))).code == "connection_failed"
        assert (await refused(grpc_send(ports.grpc, wrong))).status == \
            grpc.StatusCode.UNAVAILABLE


async def test_should_require_a_client_certificate_from_the_ca_with_mutual_tls(tmp_path, pki):
    good_cert, good_key = pki["main"].write("client", server=False)
    bad_cert, bad_key = pki["other"].write("intruder", server=False)
    ca = pki["main"].ca_file
    async with ingestor(tls_config(tmp_path, pki, mutual=True)) as ports:
        member = ClientTls(ca_file=ca, cert_file=good_cert, key_file=good_key)
        assert await http_send(ports.http, member) == 1
        assert await grpc_send(ports.grpc, member) == 1
        for stranger in (ClientTls(ca_file=ca),
                         ClientTls(ca_file=ca, cert_file=bad_cert, key_file=bad_key)):
            assert (await refused(http_send(ports.http, stranger))).status is None
            assert (await refused(grpc_send(ports.grpc, stranger))).status == \
                grpc.StatusCode.UNAVAILABLE


# -- reload without restart ----------------------------------------------------------------------

async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


async def works(send: Callable[[int, ClientTls | None], Awaitable[int]], port: int,
                tls: ClientTls) -> bool:
    try:
        return await send(port, tls) == 1
    except IngestRejected:
        return False


async def test_should_pick_up_a_rotated_certificate_without_restart(tmp_path, pki):
    config = tls_config(tmp_path, pki)
    old, new = ClientTls(ca_file=pki["main"].ca_file), ClientTls(ca_file=pki["other"].ca_file)
    async with ingestor(config, tls_reload_s=FAST_RELOAD_S) as ports, \
            AsyncHttpClient(f"https://127.0.0.1:{ports.http}", retries=0, tls=old) as kept:
            assert await kept.send("pageviews", [EVENT]) == 1  # a connection from before
            assert not await works(http_send, ports.http, new)
            # rotate: the other CA's certificate replaces the files in place
            cert, key = pki["other"].issue("server", server=True)
            Path(config.ingestor.tls_key_file).write_bytes(key)
            Path(config.ingestor.tls_cert_file).write_bytes(cert)
            assert await eventually(lambda: works(http_send, ports.http, new))
            assert await eventually(lambda: works(grpc_send, ports.grpc, new))
            assert not await works(http_send, ports.http, old)
            assert not await works(grpc_send, ports.grpc, old)
            # the connection opened before the rotation keeps its session
            assert await kept.send("pageviews", [EVENT]) == 1


async def test_should_keep_serving_the_old_certificate_when_the_new_files_are_broken(
        tmp_path, pki, caplog):
    config = tls_config(tmp_path, pki)
    trust = ClientTls(ca_file=pki["main"].ca_file)
    async with ingestor(config, tls_reload_s=FAST_RELOAD_S) as ports:
        _, unrelated_key = pki["other"].issue("server", server=True)
        with caplog.at_level(logging.WARNING, "icefloe.ingestor.tls"):
            Path(config.ingestor.tls_key_file).write_bytes(unrelated_key)  # no longer a pair
            await asyncio.sleep(FAST_RELOAD_S * 6)
        assert await http_send(ports.http, trust) == 1
        assert await grpc_send(ports.grpc, trust) == 1
        assert any("cannot be used" in r.getMessage() for r in caplog.records)
        assert not any("PRIVATE KEY" in r.getMessage() for r in caplog.records)


async def test_should_reload_through_a_symlink_swap_like_a_kubernetes_secret(tmp_path, pki):
    """Secret volumes swap a ``..data`` symlink: the file names never change."""
    main_cert, main_key = pki["main"].write("server", server=True, stem="v1")
    other_cert, other_key = pki["other"].write("server", server=True, stem="v2")
    mount = tmp_path / "mount"
    mount.mkdir()
    (tmp_path / "data").symlink_to(tmp_path / "v1-dir", target_is_directory=True)
    for version, (cert, key) in {"v1": (main_cert, main_key),
                                 "v2": (other_cert, other_key)}.items():
        folder = tmp_path / f"{version}-dir"
        folder.mkdir()
        (folder / "tls.crt").write_bytes(cert.read_bytes())
        (folder / "tls.key").write_bytes(key.read_bytes())
    (mount / "tls.crt").symlink_to(tmp_path / "data" / "tls.crt")
    (mount / "tls.key").symlink_to(tmp_path / "data" / "tls.key")
    config = make_config(tmp_path / "store", (PAGEVIEWS,), tls_cert_file=str(mount / "tls.crt"),
                         tls_key_file=str(mount / "tls.key"))
    new = ClientTls(ca_file=pki["other"].ca_file)
    async with ingestor(config, tls_reload_s=FAST_RELOAD_S) as ports:
        assert await http_send(ports.http, ClientTls(ca_file=pki["main"].ca_file)) == 1
        os.symlink(tmp_path / "v2-dir", tmp_path / "data.tmp")
        os.replace(tmp_path / "data.tmp", tmp_path / "data")
        assert await eventually(lambda: works(http_send, ports.http, new))
        assert await eventually(lambda: works(grpc_send, ports.grpc, new))


# -- the plaintext policy -------------------------------------------------------------------------

def test_should_allow_plaintext_on_loopback_only(tmp_path):
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert server_tls(make_config(tmp_path, host=host)) is None
    for host in ("0.0.0.0", "::", "10.1.2.3", "ingest.example"):
        config = msgspec.structs.replace(make_config(tmp_path, host=host),
                                         source="/etc/icefloe.toml")
        with pytest.raises(ConfigError) as info:
            server_tls(config)
        message = str(info.value)
        assert message.startswith("/etc/icefloe.toml: ingestor.plaintext: refusing to serve")
        assert "tls_cert_file" in message
        assert "plaintext = true" in message


def test_should_warn_when_serving_plaintext_on_purpose(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, "icefloe.ingestor.tls"):
        assert server_tls(make_config(tmp_path, host="0.0.0.0", plaintext=True)) is None
    assert "serving plaintext HTTP and gRPC on 0.0.0.0" in caplog.text


async def test_should_refuse_to_start_without_tls_on_a_public_address(tmp_path):
    with pytest.raises(ConfigError, match=r"ingestor\.plaintext"):
        async with ingestor(make_config(tmp_path / "store", host="0.0.0.0")):
            pass


def test_should_name_the_key_of_a_missing_or_broken_tls_file(tmp_path, pki):
    cert, key = pki["main"].write("server", server=True)
    missing = make_config(tmp_path, tls_cert_file=str(tmp_path / "nope.pem"),
                          tls_key_file=str(key))
    with pytest.raises(ConfigError, match=r"ingestor.tls_cert_file: cannot read .*nope.pem"):
        server_tls(missing)
    _, other_key = pki["other"].write("server", server=True, stem="other")
    mismatched = make_config(tmp_path, tls_cert_file=str(cert), tls_key_file=str(other_key))
    with pytest.raises(ConfigError, match="cannot load them") as info:
        server_tls(mismatched)
    assert "PRIVATE KEY" not in str(info.value)


def test_should_refuse_an_encrypted_key_without_prompting_for_its_passphrase(tmp_path, pki):
    """OpenSSL would prompt on the terminal (during a reload: on the event loop)."""
    cert, key = pki["main"].write("server", server=True)
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.BestAvailableEncryption(b"pass")))
    config = make_config(tmp_path, tls_cert_file=str(cert), tls_key_file=str(key))
    with pytest.raises(ConfigError, match=r"ingestor.tls_key_file .*: the private key is "
                                          "encrypted"):
        server_tls(config)


def test_should_offer_tls_1_2_or_newer_only(tmp_path, pki):
    reloader = server_tls(tls_config(tmp_path, pki))
    assert reloader is not None
    assert reloader.material.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert not reloader.mutual


def test_should_exit_2_with_one_line_when_a_public_address_has_no_tls(tmp_path):
    config = tmp_path / "icefloe.toml"
    config.write_text('[store]\nurl = "file://store"\n[ingestor]\nhttp_port = 0\ngrpc_port = 0\n')
    icefloe = str(Path(sys.executable).parent / "icefloe")
    done = subprocess.run([icefloe, "ingestor", "--config", str(config), "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"icefloe: error: {config}: ingestor.plaintext: refusing to serve 0.0.0.0 without TLS")
