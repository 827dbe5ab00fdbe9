"""``python -m testing.chaos``: run the chaos harness from the command line (``make chaos``).

Run from the repository root, so ``testing`` imports from this checkout."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence

from testing.chaos.report import render
from testing.chaos.run import Options, Run


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m`` or ``2h`` as seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testing.chaos",
        description="Start a real icefloe cluster here (K ingestors, a Spark collector, a "
                    "local or moto S3 store), load it with clients that record every "
                    "acknowledgement, kill -9 ingestors and collectors, start competing "
                    "collectors, and break the store in bursts (503/500, lost responses, "
                    "slowness), all on a seeded schedule. Then drain and check with an "
                    "independent pyiceberg reader that every acknowledged event is stored "
                    "exactly once. Exit 0 only if every check passes.")
    parser.add_argument("--duration", type=parse_duration, default=60.0, metavar="D",
                        help="seconds of load under faults: 90, 90s, 30m (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="names the fault schedule")
    parser.add_argument("--store", choices=["local", "s3"], default="local",
                        help="local directory, or a moto S3 server started for the run")
    parser.add_argument("--ingestors", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4,
                        help="client processes, alternating HTTP and gRPC (default 4)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests/s per client (default 0: as fast as acks come)")
    parser.add_argument("--kafka", action="store_true",
                        help="every third client is an idempotent Kafka producer "
                             "(confluent-kafka) on the ingestors' Kafka listeners")
    parser.add_argument("--no-standby", action="store_true",
                        help="no warm standby collector beside the active one (by default "
                             "one waits, as in `icefloe up`): a killed collector's "
                             "replacement then boots Spark cold")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    parser.add_argument("--workdir", metavar="DIR", help="keep the run's files here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary files")
    args = parser.parse_args(argv)
    if args.json:
        # `make chaos` names bench/results/..., which a fresh clone does not have (ignored
        # by git): create the folder up front, so a run of many minutes never ends in a
        # failed write of its result
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    opts = Options(duration_s=args.duration, seed=args.seed, store=args.store,
                   ingestors=args.ingestors, clients=args.clients, rate=args.rate,
                   keep=args.keep or args.workdir is not None, workdir=args.workdir,
                   standby=not args.no_standby, kafka=args.kafka)
    result = Run(opts).execute()
    result["hardware"] = {"machine": platform.machine(), "python": platform.python_version(),
                          "cpus": os.cpu_count()}
    print(render(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
