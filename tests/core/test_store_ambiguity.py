"""Whether a failed write may have landed: the store layers must never say "not stored"
of a write that may have been applied (a lost answer), because the ingest fronts pass it
on to clients as ``may_be_stored`` (Kafka: REQUEST_TIMED_OUT rather than "nothing was
written")."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from icefloe.errors import PreconditionFailed, TransientStoreError
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.cas import cas_document
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy

RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.002, budget_s=5)


@dataclass(frozen=True)
class Doc:
    n: int

    def encode(self) -> bytes:
        return b"%d" % self.n

    @staticmethod
    def decode(data: bytes) -> Doc:
        return Doc(int(data))


def stores(tmp_path, rules: list[FaultRule]) -> tuple[ThreadedAsyncStore, RetryingAsyncStore]:
    inner = ThreadedAsyncStore(LocalStore(tmp_path / "store"))
    return inner, RetryingAsyncStore(FaultyAsyncStore(inner, rules), RETRY)


@pytest.mark.parametrize("lost", [True, False])
async def test_a_conditional_put_refused_on_its_retry_is_ambiguous_if_its_answer_was_lost(
        tmp_path, lost):
    """The lost attempt created the key; its retry (If-None-Match: *) is refused because
    of it. That refusal may owe itself to our own write: ``ambiguous``. Refused with no
    earlier attempt, it is a plain lost race."""
    inner, store = stores(tmp_path, [FaultRule("lose_response", ops=frozenset({"put"}),
                                               times=1 if lost else 0)])
    if not lost:
        await inner.put("k", b"theirs")
    with pytest.raises(PreconditionFailed) as refused:
        await asyncio.wait_for(store.put("k", b"ours", if_none_match="*"), 10)
    assert refused.value.ambiguous is lost
    assert (await inner.get("k")).data == (b"ours" if lost else b"theirs")


async def test_a_cas_that_fails_after_a_write_it_may_have_made_says_it_may_have(tmp_path):
    """The CAS's put lands but its answer is lost; the retry meets the new ETag, and every
    re-read then fails: the error the CAS gives up with is ambiguous, though it is a read's
    (and the document is in fact written)."""
    rules = [FaultRule("lose_response", ops=frozenset({"put"})),
             FaultRule("fail", ops=frozenset({"get"}), times=None, skip=1)]
    inner, store = stores(tmp_path, rules)
    with pytest.raises(TransientStoreError, match="injected fail on get") as failed:
        await asyncio.wait_for(cas_document(store, "doc", Doc.decode, lambda: Doc(0),
                                            lambda doc: Doc(doc.value.n + 1), backoff=RETRY,
                                            what="test doc"), 10)
    assert failed.value.ambiguous is True
    assert rules[0].fired == 1
    assert (await inner.get("doc")).data == b"1"  # it had landed


async def test_a_cas_whose_reads_fail_before_any_write_is_not_ambiguous(tmp_path):
    _inner, store = stores(tmp_path, [FaultRule("fail", ops=frozenset({"get"}), times=None)])
    with pytest.raises(TransientStoreError) as failed:
        await asyncio.wait_for(cas_document(store, "doc", Doc.decode, lambda: Doc(0),
                                            lambda doc: Doc(doc.value.n + 1), backoff=RETRY,
                                            what="test doc"), 10)
    assert failed.value.ambiguous is False
    assert not (tmp_path / "store" / "doc").exists()
