"""Who the client is: the TCP peer, or what trusted proxies say it is.

Why only trusted proxies: ``X-Forwarded-For`` and ``Forwarded`` are plain request headers,
so any client can write whatever it likes into them. They are believed only when the TCP
peer is one of ``[ingestor] trusted_proxies``, and then only as far as the chain of trusted
hops goes: walking the hops from the right (nearest) to the left, the first address that is
not a trusted proxy is the client. Everything to its left was written by that client and is
ignored. The result feeds logs and per-client rate limits (and later the ``ip`` mapping).

Only one of the two headers is read: the one the trusted proxies write
(``[ingestor] forwarded_header``, ``x-forwarded-for`` by default; ``forwarded`` for RFC 7239).
A proxy that writes one of them passes the other through as the client sent it, so reading
the other — or preferring it when both are present — would let any client choose its
address. A hop that is not an IP address (``unknown``, an obfuscated ``_node`` name,
garbage) ends the walk: the client is then the nearest hop that is known, which is the
proxy that reported it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOPS = 32
"""Hops considered at most (a longer header is cut from the left: the far end)."""


def parse_ip(text: str) -> IpAddress | None:
    """An address from a peer string or a forwarded hop: ``1.2.3.4``, ``1.2.3.4:80``,
    ``[::1]:80``, ``"[::1]"``, IPv4-mapped IPv6 (returned as IPv4); None if not an IP."""
    value = text.strip().strip('"')
    if value.startswith("["):
        value = value[1:value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def forwarded_hops(value: str) -> list[str]:
    """The ``for=`` values of a ``Forwarded`` header, left (client) to right (nearest)."""
    hops: list[str] = []
    for element in value.split(","):
        for pair in element.split(";"):
            key, _, hop = pair.strip().partition("=")
            if key.strip().lower() == "for":
                hops.append(hop.strip())
    return hops


def xff_hops(value: str) -> list[str]:
    """The addresses of an ``X-Forwarded-For`` header, left (client) to right (nearest)."""
    return [hop.strip() for hop in value.split(",") if hop.strip()]


class TrustedProxies:
    """``[ingestor] trusted_proxies`` and the walk that finds the client behind them.

    Thread-safe (immutable after construction).
    """

    def __init__(self, networks: Iterable[str], header: str = "x-forwarded-for") -> None:
        self.networks: tuple[IpNetwork, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in networks)
        if header not in ("x-forwarded-for", "forwarded"):
            raise ValueError(f"unknown forwarded header {header!r}")
        self.header = header

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: IpAddress | None) -> bool:
        if address is None:
            return False
        return any(address in network for network in self.networks)

    def client(self, peer: str, forwarded: str | None = None,
               x_forwarded_for: str | None = None) -> str:
        """The client address of a request from TCP ``peer`` with these headers (only the
        configured one of ``forwarded`` and ``x_forwarded_for`` is read)."""
        peer_ip = parse_ip(peer)
        if not self.networks or not self.trusts(peer_ip):
            return str(peer_ip) if peer_ip is not None else peer
        if self.header == "forwarded":
            hops = forwarded_hops(forwarded) if forwarded else []
        else:
            hops = xff_hops(x_forwarded_for) if x_forwarded_for else []
        return str(self._walk(hops[-MAX_HOPS:], peer_ip))

    def _walk(self, hops: Sequence[str], nearest: IpAddress | None) -> IpAddress | None:
        """From the right: skip trusted hops; the first untrusted one is the client."""
        for hop in reversed(hops):
            address = parse_ip(hop)
            if address is None:
                return nearest  # an unknown hop: the proxy that reported it is all we know
            if not self.trusts(address):
                return address
            nearest = address
        return nearest  # every hop is a trusted proxy: the leftmost one is the client
