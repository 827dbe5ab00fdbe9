"""The commands of the docs/ pages, run from a fresh clone page by page, in the order the page
shows them.

``tests/system/test_readme_commands.py`` holds the rule (every ```sh command of the README,
``docs/`` and ``deploy/README.md`` runs in a test or is listed with the reason it cannot run
here) and maps each command to the test below that runs it. Here a page's commands are read
from the page itself (``page_commands``), so a command changed on the page is the command
that runs; what is substituted is said in ``Session.shell``: free ports for the documented
ones, the token a previous command printed for ``ifl_...``. Each command runs in ``bash``
from the clone's root with ``.venv/bin`` first on ``PATH``, must exit 0 (or as the page
says) and print what the page promises. Long-running servers (``icefloe ingestor``,
``icefloe admin``) are started in the background and waited for, as a user would open a
second terminal. No Spark starts here: the pages whose commands need it are run by the
slow tests named in ``RUN``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from process_support import free_port, wait_for
from test_readme_commands import MAKE_KEEP, clone, clone_env, commands

__all__ = ["clone"]  # the fresh-clone fixture, shared with test_readme_commands

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ("icefloe ingestor", "icefloe admin", "icefloe collector")
"""Commands that serve until stopped: started in the background, then waited for."""


def page_commands(page: str) -> list[str]:
    """The ```sh commands of ``docs/<page>``, as the docs rule reads them."""
    return commands((ROOT / "docs" / page).read_text())


def page_block(page: str, lang: str, after: str = "") -> str:
    """The first ```lang block of ``docs/<page>`` after the text ``after``."""
    text = (ROOT / "docs" / page).read_text()
    start = text.index(after) if after else 0
    return re.search(rf"```{lang}\n(.*?)```", text[start:], re.S).group(1)


class Session:
    """One user at one shell in the clone: environment, ports, background servers."""

    def __init__(self, clone: Path, work: Path) -> None:
        self.clone = clone
        self.http, self.grpc, self.admin = free_port(), free_port(), free_port()
        self.env = clone_env(clone, ICEFLOE_DATA_DIR=str(work / "data"),
                             ICEFLOE_ADMIN_PORT=str(self.admin),
                             ICEFLOE_INGESTOR_HOST="127.0.0.1",
                             PATH=f"{clone / '.venv' / 'bin'}:{os.environ['PATH']}")
        self.token = ""
        self.as_of = ""  # the documented --as-of time, once the tables have commits
        self.servers: list[tuple[subprocess.Popen[str], Path]] = []
        self.work = work

    def substituted(self, command: str) -> str:
        """The command with this session's ports and token in place of the documented."""
        out = command.replace("localhost:8080", f"localhost:{self.http}")
        out = out.replace("localhost:8081", f"localhost:{self.admin}")
        out = out.replace("--http-port 8080", f"--http-port {self.http}")
        out = out.replace("--grpc-port 50051", f"--grpc-port {self.grpc}")
        out = out.replace("COLLECT_PORT=8080", f"COLLECT_PORT={self.http}")
        if self.token:
            out = out.replace("ifl_...", self.token)
        if self.as_of:
            out = out.replace("--as-of 2026-11-23T17:00:00Z", f"--as-of {self.as_of}")
        return out

    def shell(self, command: str, *, expect: int = 0, stdin: str | None = None,
              timeout: float = 120) -> str:
        """Run one documented command; return its stdout (and stderr) after checking its
        exit code. ``export NAME=value`` sets the variable for the later commands."""
        command = self.substituted(command)
        if command.startswith("export "):
            name, _, value = command[len("export "):].partition("=")
            self.env[name] = value.strip("'\"")
            return ""
        argv = ["bash", "-c", command]
        if command.startswith("make "):
            argv = ["bash", "-c", command.replace("make ", f"make {' '.join(MAKE_KEEP)} ", 1)]
        done = subprocess.run(argv, cwd=self.clone, env=self.env, input=stdin,
                              capture_output=True, text=True, timeout=timeout, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == expect, (command, done.returncode, output[-3000:])
        return output

    def serve(self, command: str, ready: str, timeout: float = 120) -> None:
        """Start a documented server command in the background; wait until ``ready``
        (a URL) answers 200."""
        command = self.substituted(command)
        log = self.work / f"server-{len(self.servers)}.log"
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.clone,
                                env=self.env, stdout=log.open("w"),
                                stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.servers.append((proc, log))

        def answers() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(ready, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout, f"{command} to answer {ready}")

    def stop(self) -> None:
        for proc, log in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            # icefloe's own errors are one line; a traceback is a bug. Not for the
            # collector: pyspark's accumulator server prints an EOFError traceback of its own
            # when the JVM goes away at exit (as the fenced collector does)
            if "icefloe collector" not in proc.args[-1]:
                assert "Traceback" not in log.read_text(), log.read_text()[-3000:]

    def run_page(self, page: str, checks: dict[str, str], *, ready: dict[str, str]
                 ) -> dict[str, str]:
        """Every command of ``page`` in order: servers started, the rest run; the output
        of each command whose text starts with a key of ``checks`` must hold its value."""
        outputs: dict[str, str] = {}
        for command in page_commands(page):
            server = next((s for s in SERVERS if command.startswith(s)), None)
            if server is not None:
                self.serve(command, self.substituted(ready[server]))
                continue
            output = self.shell(command)
            outputs[command] = output
            for start, fragment in checks.items():
                if command.startswith(start):
                    assert fragment in output, (command, output[-3000:])
            found = re.search(r"\bifl_[A-Za-z0-9_-]{20,}", output)
            if command.startswith("icefloe token new") and found:
                self.token = found.group(0)
                self.env["ICEFLOE_ADMIN_TOKENS"] = re.search(r"scrypt\$\S+", output).group(0)
        return outputs


@pytest.fixture
def session(clone: Path, tmp_path: Path) -> Iterator[Session]:
    user = Session(clone, tmp_path)
    try:
        yield user
    finally:
        user.stop()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)


def _ready(session: Session) -> dict[str, str]:
    return {"icefloe ingestor": f"http://127.0.0.1:{session.http}/readyz",
            "icefloe admin": f"http://127.0.0.1:{session.admin}/healthz"}


def test_ingesting_page(session: Session) -> None:
    """The ingestor on the example config, then the batch with an idempotency key: 202."""
    out = session.run_page("ingesting.md", {"curl ": '{"accepted":1}'}, ready=_ready(session))
    assert len(out) == 1


def test_security_page_token_commands(session: Session) -> None:
    """``token new`` prints a token and its hash; ``token hash`` makes a hash of a token read
    from stdin; ``token check`` names the configured entry it matches: the page's
    ``[[tokens]]`` entry with the new hash, in ``./icefloe.toml`` beside the example's
    streams."""
    (new,) = [c for c in page_commands("security.md") if c.startswith("icefloe token new")]
    printed = session.shell(new)
    token = re.search(r"\bifl_\S+", printed).group(0)
    hashed = re.search(r"scrypt\$\S+", printed).group(0)
    (session.clone / "token.txt").write_text(token + "\n")
    entry = page_block("security.md", "toml", "or into a named top-level entry")
    assert '"scrypt$ln=14,r=8,p=1$..."' in entry
    config = session.clone / "icefloe.toml"
    config.write_text((session.clone / "examples" / "icefloe.toml").read_text() + "\n"
                      + entry.replace('"scrypt$ln=14,r=8,p=1$..."', f'"{hashed}"'))
    try:
        for command in page_commands("security.md")[1:]:
            output = session.shell(command)
            if command.startswith("icefloe token hash"):
                assert re.search(r"scrypt\$ln=14,r=8,p=1\$\S+\$\S+", output), output
            else:
                assert "web-frontend" in output, output
    finally:
        (session.clone / "token.txt").unlink()
        config.unlink()


def test_admin_api_page(session: Session) -> None:
    """The page's CLI session against a real admin API: a source, a sink from the page's
    ``sink.toml`` (its table made by the task), changed, disabled, a token rotated, the
    source retired."""
    (session.clone / "sink.toml").write_text(page_block("admin-api.md", "toml", "`sink.toml`"))
    try:
        out = session.run_page("admin-api.md", {
            "icefloe sources create": "clicks",
            "icefloe sinks create": "clicks_raw",
            "icefloe sources rotate-token": "ifl_",
        }, ready=_ready(session))
    finally:
        (session.clone / "sink.toml").unlink()
    assert any(c.startswith("icefloe sinks disable") for c in out)
    assert "clicks" not in session.shell("icefloe sources list")


def test_keboola_page(session: Session) -> None:
    """Keboola's requests as the page types them: a source, the page's sink.json (a task
    that makes the table), and an event posted to the new source (202 once the ingestor
    follows the registry)."""
    session.env["ICEFLOE_CONFIG"] = str(session.clone / "examples" / "icefloe.toml")
    printed = session.shell("icefloe token new")
    session.token = re.search(r"\bifl_\S+", printed).group(0)
    session.env["ICEFLOE_ADMIN_TOKENS"] = re.search(r"scrypt\$\S+", printed).group(0)
    session.serve("icefloe admin", f"http://127.0.0.1:{session.admin}/healthz")
    session.serve(f"icefloe ingestor --http-port {session.http} --grpc-port {session.grpc}",
                  f"http://127.0.0.1:{session.http}/readyz")
    (session.clone / "sink.json").write_text(page_block("coming-from/keboola.md", "json"))
    try:
        create_source, create_sink, post = page_commands("coming-from/keboola.md")
        assert '"sourceId"' in session.shell(create_source + " -s")
        task = json.loads(session.shell(create_sink + " -s"))
        assert task["type"] == "sink.create", task

        def created() -> bool:
            state = httpx.get(f"http://127.0.0.1:{session.admin}{task['url']}",
                              headers={"X-StorageApi-Token": session.token}, timeout=5).json()
            assert state["status"] != "error", state
            return state["isFinished"]

        wait_for(created, 60, "the sink task")

        def accepted() -> bool:
            return '"accepted":1' in session.shell(post + " -s")

        wait_for(accepted, 30, "the ingestor to follow the registry")
    finally:
        (session.clone / "sink.json").unlink()


def test_moose_page(session: Session) -> None:
    """The page's stream (``on_invalid = "dead_letter"``) and its curl: one accepted, two
    dead-lettered."""
    config = session.work / "moose.toml"
    config.write_text(page_block("coming-from/moose.md", "toml"))
    session.serve(f"icefloe ingestor --config {config} --http-port 8080 --grpc-port 50051",
                  f"http://127.0.0.1:{session.http}/readyz")
    (curl,) = page_commands("coming-from/moose.md")
    assert '{"accepted":1,"dead_lettered":2}' in session.shell(curl + " -s")


def test_contributing_page_developer_loop(session: Session) -> None:
    """The developer loop but ``make test`` (this suite) and the simulator seed (run with
    docs/simulator.md's commands below)."""
    for command in page_commands("contributing.md"):
        if command.startswith(("make test", "make sim")):
            continue
        output = session.shell(command, timeout=300)
        if "pytest" in command:
            assert re.search(r"\d+ passed", output), output
        elif "ruff" in command:
            assert "All checks passed" in output, output
        else:
            assert (session.clone / "build" / "site" / "index.html").is_file(), output


@pytest.mark.slow  # ~35 s: make test runs these seeds through tests/system/test_sim.py
def test_simulator_page_one_seed_and_one_mutant(session: Session) -> None:
    """``make sim SEED=17`` tells the seed's story and passes; the mutant line finds its
    known bug (exit 1, the broken invariant named)."""
    one, many, _more, mutant = page_commands("simulator.md")
    assert (one, many) == ("make sim SEED=17", "make sim SEEDS=200")
    assert "failed" not in session.shell(one, timeout=300).split("\n")[-2]
    found = session.shell(mutant, expect=1, timeout=300)
    assert "FAILED" in found or "failed" in found, found[-2000:]


@pytest.mark.slow
def test_spark_pages(session: Session) -> None:
    """The pages whose commands need Spark, one system for all of them (~2-3 min: three
    Spark starts). The ingesting page's ingestor and curl, the operations page's collector
    on the example config, one order; then the querying page's four queries (the
    documented ``--as-of`` time becomes now: the tables here began today), the models
    page's line, and the operations page's ``--takeover`` line: a second collector fences
    the first, which exits 3."""
    session.env["ICEFLOE_CONFIG"] = str(session.clone / "examples" / "icefloe.toml")
    metrics, second = free_port(), free_port()
    start_ingestor, post = page_commands("ingesting.md")
    session.serve(start_ingestor, f"http://127.0.0.1:{session.http}/readyz")
    collector, takeover = page_commands("operations.md")
    assert "--metrics-port 9464" in collector
    session.serve(collector.replace("--metrics-port 9464", f"--metrics-port {metrics}"),
                  f"http://127.0.0.1:{metrics}/readyz", timeout=240)
    assert '{"accepted":1}' in session.shell(post)
    order = {"order_id": "o-1", "customer_id": "c-1", "amount": 12.5, "currency": "EUR"}
    assert httpx.post(f"http://127.0.0.1:{session.http}/v1/streams/orders/events",
                      json=order, timeout=30).status_code == 202

    count, as_of, dead, spark = page_commands("querying.md")

    def committed() -> bool:
        output = session.shell(count, timeout=240)
        return re.search(r"\|\s*1\s*\|", output) is not None \
            and "o-1" in session.shell("icefloe query 'SELECT order_id FROM shop.orders'")

    wait_for(committed, 240, "both events to be committed")
    session.as_of = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "o-1" in session.shell(as_of)
    assert "reason" in session.shell(dead)
    assert re.search(r"\|\s*/\s*\|", session.shell(spark, timeout=300))

    (models,) = page_commands("models.md")
    assert "views" in session.shell(models, timeout=300)

    first = session.servers[-1][0]
    session.env["ICEFLOE_COLLECTOR_METRICS_PORT"] = str(second)
    session.serve(takeover, f"http://127.0.0.1:{second}/readyz", timeout=240)
    assert first.wait(60) == 3  # fenced
