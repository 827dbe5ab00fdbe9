"""A diagnostic ingestor for the security benchmark: the real one, with or without the HTTP
front's own limits (issue #29).

``python bench/_limits_ingestor.py CONFIG on|off`` runs ``icefloe ingestor`` from this
source tree. ``on`` is unchanged. ``off`` takes the limits' per-request code out of the
protocol class — uvicorn's own ``data_received`` and ``on_header`` instead of the counting
ones, no version/transfer-coding check at the end of headers — so the two runs differ by
exactly what the limits cost a request. Only a baseline for the benchmark; never a way to
run icefloe. Prints the same ``ready`` JSON line as ``icefloe ingestor``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import serve_announcing
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from icefloe.config import load_config
from ingestor.http import server as http_server


def _without_limits(guard: Any, lane: Any = None, limits: Any = None) -> Any:
    limited = _guarded(guard, lane, limits)

    class Unlimited(limited):  # type: ignore[misc, valid-type]
        data_received = HttpToolsProtocol.data_received
        on_header = HttpToolsProtocol.on_header

        def _check_framing(self) -> None:
            return None

    return Unlimited


_guarded = http_server.guarded_protocol


def main() -> int:
    config = load_config(Path(sys.argv[1]))
    if sys.argv[2] == "off":
        http_server.guarded_protocol = _without_limits
    return serve_announcing(config)


if __name__ == "__main__":
    sys.exit(main())
