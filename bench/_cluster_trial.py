"""One ``collector_bench.py`` cluster trial in its own process (a process has one
SparkContext, and the bench's own is ``local[2]``): drain copies of a pre-filled store
through the collector on the given Spark master and print the best rate as a JSON line.

    python bench/_cluster_trial.py --master spark://127.0.0.1:7077 --template DIR \
        --work DIR --events N [--output cluster|embedded] [--rounds 3]

The first round warms the JVM and the executors' Python workers up and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector_bench import make_config, throughput

from pipeline.load.run import SparkClusterEngine, SparkEngine
from pipeline.spark import get_spark
from testing.spark_standalone import DRIVER_CONF

PARTITIONS = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--template", type=Path, required=True,
                        help="a make_config root whose store is pre-filled")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--output", choices=["cluster", "embedded"], default="cluster")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    conf = {"spark.driver.memory": "2g", **(DRIVER_CONF if args.master.startswith("spark://")
                                             else {})}
    spark = get_spark(args.master, "icefloe-bench-cluster", conf)
    engine = SparkClusterEngine(spark, PARTITIONS) if args.output == "cluster" \
        else SparkEngine(spark, PARTITIONS)
    rates = []
    for round_ in range(args.rounds):
        root = args.work / f"round-{round_}"
        shutil.copytree(args.template / "store", root / "store")
        config = make_config(root, output=args.output, spark_partitions=PARTITIONS)
        rate, _ = asyncio.run(throughput(config, engine, args.events))
        print(f"  {args.master} {args.output} round {round_ + 1}: {rate:,.0f} events/s"
              f"{' (warm-up)' if round_ == 0 else ''}", file=sys.stderr, flush=True)
        if round_:
            rates.append(rate)
        shutil.rmtree(root)
    spark.stop()
    print(json.dumps({"events_per_s": max(rates)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
