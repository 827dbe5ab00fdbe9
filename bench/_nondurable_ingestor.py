"""A diagnostic ingestor for the ingest benchmark: the real one, minus durability.

``python bench/_nondurable_ingestor.py CONFIG`` runs the very same HTTP and gRPC fronts
(uvicorn + icefloe's protocol, auth, validation, canonical payloads, event ids, framing,
metrics) but answers as soon as a request is framed: the future the batcher's
``enqueue`` returns is already resolved, nothing is written. It exists only to split the
gap between a durable ingestor and the bare stack into "icefloe's per-request work" and
"waiting for durability"; never a way to run icefloe. Prints the same ``ready`` JSON
line as ``icefloe ingestor``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import serve_announcing

from icefloe.config import load_config
from ingestor import buffer


def _answer_at_once(self: buffer.Batcher, framed: bytes, count: int, stream: str,
                    registry_version: int = 0, also: tuple[str, ...] = ()
                    ) -> asyncio.Future[None]:
    """Stands in for :meth:`Batcher.enqueue`: the events are framed, then dropped."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


def main() -> int:
    config = load_config(Path(sys.argv[1]))
    buffer.Batcher.enqueue = _answer_at_once  # type: ignore[method-assign]
    return serve_announcing(config)


if __name__ == "__main__":
    sys.exit(main())
