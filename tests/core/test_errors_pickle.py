"""Every icefloe error survives a trip through pickle: the local store's helper process
answers with the very exception its store raised, and a class whose ``__init__`` takes other
arguments than its message failed to unpickle there, breaking the channel."""

from __future__ import annotations

import pickle

import pytest

import icefloe.errors as errors


def every_error_class() -> list[type[errors.IcefloeError]]:
    found: list[type[errors.IcefloeError]] = []
    todo = [errors.IcefloeError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted({c for c in found if c.__module__ == errors.__name__},
                  key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda c: c.__name__)
def test_should_round_trip_every_error_class(cls: type[errors.IcefloeError]) -> None:
    error = cls.__new__(cls)
    Exception.__init__(error, "what went wrong")
    error.__dict__.update(detail=7)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == "what went wrong"
    assert back.detail == 7  # type: ignore[attr-defined]


def test_should_keep_what_the_constructors_set() -> None:
    fenced = pickle.loads(pickle.dumps(errors.FencedError(3, 5)))
    assert (fenced.our_epoch, fenced.current_epoch) == (3, 5)
    assert "epoch 3" in str(fenced)
    malformed = pickle.loads(pickle.dumps(errors.BatchFormatError("short_footer", "4 bytes")))
    assert malformed.reason == "short_footer"
    assert str(malformed) == "short_footer: 4 bytes"
    stored = pickle.loads(pickle.dumps(errors.TransientStoreError(
        "503", op="put", key="k", ambiguous=True, code="SlowDown")))
    assert (stored.op, stored.key, stored.ambiguous) == ("put", "k", True)
    held = pickle.loads(pickle.dumps(errors.LeaseHeldError("collector-a", 4.5)))
    assert str(held) == str(errors.LeaseHeldError("collector-a", 4.5))
