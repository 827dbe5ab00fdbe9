"""The client address behind trusted proxies: the walk itself, then on a real ingestor."""

from __future__ import annotations

import logging

import grpc
import httpx
import pytest
from ingest_support import ORDERS, PAGEVIEWS, make_config
from security_support import ingestor

from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from ingestor.client_address import TrustedProxies, forwarded_hops, parse_ip
from ingestor.grpc_app import peer_host

NETWORKS = ["10.0.0.0/8", "127.0.0.1", "2001:db8::/32"]
PROXIES = TrustedProxies(NETWORKS)
RFC_7239_PROXIES = TrustedProxies(NETWORKS, "forwarded")


@pytest.mark.parametrize(("peer", "forwarded", "xff", "client"), [
    ("203.0.113.5", None, "198.51.100.1", "203.0.113.5"),  # untrusted peer: header ignored
    ("10.1.1.1", None, None, "10.1.1.1"),  # a trusted peer without headers is the client
    ("10.1.1.1", None, "198.51.100.1", "198.51.100.1"),
    ("10.1.1.1", None, "6.6.6.6, 198.51.100.1, 10.2.2.2", "198.51.100.1"),  # rightmost untrusted
    ("10.1.1.1", None, "10.3.3.3, 10.2.2.2", "10.3.3.3"),  # all trusted: the leftmost
    ("10.1.1.1", None, "garbage, 10.2.2.2", "10.2.2.2"),  # unknown hop: who reported it
    ("10.1.1.1", None, "[2001:dead::1]:443, 2001:db8::9", "2001:dead::1"),  # IPv6 hops
    ("::ffff:10.0.0.7", None, "198.51.100.1", "198.51.100.1"),  # IPv4-mapped peer
])
def test_should_find_the_rightmost_untrusted_hop(peer, forwarded, xff, client):
    assert PROXIES.client(peer, forwarded, xff) == client


@pytest.mark.parametrize(("peer", "forwarded", "xff", "client"), [
    ("127.0.0.1", 'for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"', None,
     "192.0.2.60"),  # an IPv6 hop in the trusted range
    ("127.0.0.1", 'For="[2001:dead::1]:80"', "198.51.100.1", "2001:dead::1"),
    ("127.0.0.1", "for=unknown", None, "127.0.0.1"),
    ("127.0.0.1", None, "198.51.100.1", "127.0.0.1"),  # X-Forwarded-For is client input here
    ("203.0.113.5", "for=198.51.100.1", None, "203.0.113.5"),  # untrusted peer
])
def test_should_read_forwarded_when_the_proxies_write_that(peer, forwarded, xff, client):
    assert RFC_7239_PROXIES.client(peer, forwarded, xff) == client


def test_should_ignore_the_header_the_proxies_do_not_write():
    """A proxy that sets X-Forwarded-For passes a client's own ``Forwarded`` through: were it
    read (or preferred), every client could name any address it likes."""
    spoofed = "for=192.0.2.1"
    assert PROXIES.client("10.1.1.1", spoofed, "198.51.100.7") == "198.51.100.7"
    assert PROXIES.client("10.1.1.1", spoofed, None) == "10.1.1.1"
    assert RFC_7239_PROXIES.client("10.1.1.1", "for=198.51.100.7", "192.0.2.1") == \
        "198.51.100.7"


def test_should_trust_nobody_without_a_list():
    assert TrustedProxies([]).client("127.0.0.1", "for=1.2.3.4", "1.2.3.4") == "127.0.0.1"


def test_should_parse_hops_and_peers():
    assert forwarded_hops('for=a;by=b, proto=https;FOR="[::1]:1"') == ["a", '"[::1]:1"']
    assert str(parse_ip('"[::1]:1"')) == "::1"
    assert str(parse_ip("1.2.3.4:80")) == "1.2.3.4"
    assert parse_ip("_hidden") is None
    assert peer_host("ipv4:127.0.0.1:5555") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:5555") == "::1"
    assert peer_host("ipv6:%5B::1%5D:5555") == "::1"
    assert peer_host("unix:/tmp/s") is None


# -- end to end: the address in the log line of a refused token --------------------------------

async def refuse_once(http_port: int, grpc_port: int, token: str, forwarded_for: str) -> None:
    """One refused request per transport, each claiming ``forwarded_for``."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(
            f"http://127.0.0.1:{http_port}/v1/streams/orders/events",
            content=b'{"order_id":"x"}',
            headers={"authorization": f"Bearer {token}-http", "x-forwarded-for": forwarded_for})
    assert response.status_code == 403
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await ingest_pb2_grpc.IngestStub(channel).Publish(
                ingest_pb2.PublishRequest(stream="orders", events=[
                    ingest_pb2.Event(json=b'{"order_id":"y"}')]),
                metadata=(("authorization", f"Bearer {token}-grpc"),
                          ("x-forwarded-for", forwarded_for)), timeout=10)


@pytest.mark.parametrize(("trusted", "seen"), [(("127.0.0.0/8",), "198.51.100.77"),
                                               (("10.0.0.0/8",), "127.0.0.1")])
async def test_should_log_the_forwarded_client_only_behind_a_trusted_proxy(
        tmp_path, caplog, trusted, seen):
    config = make_config(tmp_path / "store", (PAGEVIEWS, ORDERS), trusted_proxies=trusted)
    with caplog.at_level(logging.INFO, "icefloe.ingestor.auth"):
        async with ingestor(config) as ports:
            await refuse_once(ports.http, ports.grpc, "ifl_wrong", "198.51.100.77")
    lines = [r.getMessage() for r in caplog.records if "refused a token" in r.getMessage()]
    assert len(lines) == 2
    assert all(f"from {seen}:" in line for line in lines), lines
