"""The cluster output path plans schema evolution from per-partition summaries: the plan
and every row's verdict must be exactly what one pass over all the rows gives
(:func:`icefloe.streams.evolution.plan_run`), however the rows are cut into partitions
and in whatever order the partitions' summaries arrive. No Spark: the executors' functions
called directly."""

from __future__ import annotations

import random

import msgspec
import pyarrow as pa
import pytest

from icefloe.streams.evolution import EvolveLimits, parse_extras, plan_observed, plan_run
from pipeline.load.extras import column_of, merge_summaries, refusals, summarise

VALUES = [1, 2**40, 2**64, 16777217, 2.5, 1e300, "s", True, None, [1, 2], [1, "x"], [],
          {"a": 1}, {"a": "x"}, {"b": [1]}, {"1bad": 1}, [[[[1]]]], {}]
NAMES = ["m", "n", "M", "qty", "ratio", "geo", "_sequence", "bad-name", "x" * 20]
TABLE = {"user_id": "string", "_event_id": "string", "qty": "int", "ratio": "float",
         "old": "long"}
FIXED = {"user_id", "_event_id"}
LIMITS = EvolveLimits(max_columns=9, max_name_length=16, max_depth=3)


def random_texts(rng: random.Random, count: int) -> list[str | None]:
    texts: list[str | None] = []
    for _ in range(count):
        if rng.random() < 0.1:
            texts.append(None)
            continue
        fields = {rng.choice([*NAMES, "old"]): rng.choice(VALUES)
                  for _ in range(rng.randint(0, 3))}
        texts.append(msgspec.json.encode(fields).decode())
    return texts


@pytest.mark.parametrize("seed", range(40))
def test_summaries_of_any_partitioning_give_the_one_pass_plan(seed: int) -> None:
    rng = random.Random(seed)
    texts = random_texts(rng, rng.randint(1, 60))
    whole = plan_run(parse_extras(texts), TABLE, FIXED, LIMITS, table="t")
    existing = {n: t for n, t in TABLE.items() if n not in FIXED}
    cuts = sorted(rng.sample(range(1, len(texts) + 1), min(3, len(texts))))
    parts, start = [], 0
    for end in [*cuts, len(texts)]:
        rows = list(range(start, end))
        parts.append(summarise(rows, texts[start:end], existing, LIMITS.max_depth))
        start = end
    rng.shuffle(parts)  # tasks finish in any order
    observed = merge_summaries(pa.Table.from_batches(parts))
    plan = plan_observed(observed, TABLE, FIXED, LIMITS, table="t")
    assert plan.changes == whole.changes
    assert plan.columns == whole.columns
    judged = refusals(list(range(len(texts))), texts, plan, LIMITS, "t")
    assert dict(zip(judged.column("row").to_pylist(), judged.column("message").to_pylist(),
                    strict=True)) == whole.refused


def test_evolved_columns_take_the_table_types() -> None:
    extras = parse_extras(['{"n":1,"geo":{"a":2}}', None, '{"n":2.5}'])
    assert column_of(extras, "n", "double").to_pylist() == [1.0, None, 2.5]
    assert column_of(extras, "geo", "json").to_pylist() == ['{"a":2}', None, None]
