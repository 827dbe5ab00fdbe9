"""The real admin process's server (``serve_admin``) on a free port, in a thread: what the
admin API, Keboola API and schema-registry tests talk to over real HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from icefloe.config import Config


@contextmanager
def admin_server(config: Config, *, open_store: Callable[[], Any] | None = None,
                 **serve: Any) -> Iterator[str]:
    """Serve ``config``'s admin API until the block ends; yields its base URL. ``open_store``
    makes a store inside the server's loop (closed with it); ``serve`` goes to
    ``serve_admin`` as is (``clock=...``). A server that failed to start or stop fails the
    test with its exception."""
    from icefloe_app.api.server import serve_admin

    state: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        stop = asyncio.Event()
        state["stop"], state["loop"] = stop, asyncio.get_running_loop()
        store = open_store() if open_store is not None else None
        try:
            await serve_admin(config, stop=stop, on_ready=lambda info: (
                state.update(port=info.port), ready.set()),
                **({"store": store} if store is not None else {}), **serve)
        finally:
            if store is not None:
                await store.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    assert "error" not in state, state.get("error")
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
    assert "error" not in state, state.get("error")
