"""The admin API's token checks under a flood of wrong tokens: a proven admin token stays
cached (never evicted by wrong ones, least recently used first), and an IPv6 client's
failure budget is its /64, not each address."""

from __future__ import annotations

import asyncio

import pytest

from icefloe.clock import ManualClock
from icefloe.tokens import hash_token
from icefloe_app.api import auth
from icefloe_app.api.auth import AdminAuth, Throttled

TOKEN = "the-admin-token"


def test_a_proven_token_survives_a_flood_of_distinct_wrong_tokens(monkeypatch) -> None:
    checker = AdminAuth([hash_token(TOKEN, log2_n=10)], clock=ManualClock(0.0))
    verified: list[str] = []
    real = checker._verify

    def counting(token: str) -> bool:
        verified.append(token)
        return real(token)

    monkeypatch.setattr(checker, "_verify", counting)

    async def go() -> None:
        assert await checker.check(TOKEN, "10.0.0.1")
        for i in range(auth.MAX_CACHED * 2):  # from many addresses: no budget runs out
            assert not await checker.check(f"wrong-{i}", f"10.1.{i // 250}.{i % 250}")
        verified.clear()
        assert await checker.check(TOKEN, "10.0.0.1")
        assert verified == []  # answered from the cache: no slow hash under attack

    asyncio.run(go())


def test_an_ipv6_clients_failure_budget_is_its_slash_64() -> None:
    checker = AdminAuth([hash_token(TOKEN, log2_n=10)], clock=ManualClock(0.0))

    async def go() -> None:
        for i in range(auth.FAILED_BURST):
            assert not await checker.check(f"wrong-{i}", f"2001:db8:1:2::{i + 1:x}")
        with pytest.raises(Throttled):  # another address of the same /64
            await checker.check("wrong-next", "2001:db8:1:2::ffff")
        assert not await checker.check("wrong-next", "2001:db8:1:3::1")  # another /64

    asyncio.run(go())
