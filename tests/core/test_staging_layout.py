"""The staging layout (:mod:`icefloe.staging`): the keys and state bytes the collector
writes and the admin API reads must stay what they were, or an upgraded process would not
find what an older one staged."""

from __future__ import annotations

from icefloe.staging import (
    StagedFile,
    StagingState,
    data_key,
    state_key,
    table_of_state,
)


def test_should_name_state_and_data_keys_under_the_staging_prefix() -> None:
    assert state_key("web.clicks") == "staging/web.clicks/state.json"
    assert data_key("web.clicks", 7, 42, "01J") == \
        "staging/web.clicks/000000000007-000000000042-01J.parquet"


def test_should_find_the_table_of_a_state_key_and_nothing_in_a_data_key() -> None:
    assert table_of_state(state_key("web.clicks")) == "web.clicks"
    assert table_of_state(data_key("web.clicks", 1, 2, "x")) is None
    assert table_of_state("registry/state.json") is None


def test_should_round_trip_a_state_in_its_stored_json() -> None:
    staged = StagedFile(data_key("t", 1, 2, "x"), 1, 2, rows=3, bytes=100, oldest_ms=5)
    state = StagingState(table="t", epoch=4, revision=2, through_sequence=2, files=(staged,))
    data = state.encode()
    assert data.startswith(b'{"format":1,"table":"t","epoch":4')
    assert StagingState.decode(data) == state
    assert (state.rows, state.bytes, state.oldest_ms, state.last_sequence) == (3, 100, 5, 2)


def test_should_read_a_format_1_state_as_shard_0_and_record_shards_once_staged() -> None:
    old = (b'{"format":1,"table":"t","epoch":4,"revision":2,"through_sequence":7,"files":'
           b'[{"key":"k","first_sequence":5,"last_sequence":7,"rows":3,"bytes":9,'
           b'"oldest_ms":1}]}')
    state = StagingState.decode(old)
    assert (state.staged_through, state.files[0].through) == ({0: 7}, {0: 7})
    assert state.encode() == old  # a single-shard state keeps its bytes
    grown = state.with_through({0: 8, 1: 3})
    assert (grown.format, grown.through_sequence, grown.staged_through) == \
        (2, 8, {0: 8, 1: 3})
    assert StagingState.decode(grown.encode()) == grown
    assert grown.with_through({1: 2}).staged_through == {0: 8, 1: 3}  # never backwards
