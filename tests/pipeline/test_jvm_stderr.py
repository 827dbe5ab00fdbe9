"""What the JVM writes past log4j comes out as JSON lines in a JSON-logging process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.jvm_stderr import json_line


def test_should_pass_json_lines_and_wrap_the_rest():
    assert json_line('{"level": "warn", "msg": "x"}\n') == '{"level": "warn", "msg": "x"}'
    wrapped = json.loads(json_line("WARNING: Using incubator modules: jdk.incubator.vector\n"))
    assert wrapped["logger"] == "spark.stderr"
    assert wrapped["level"] == "warning"
    assert wrapped["msg"] == "WARNING: Using incubator modules: jdk.incubator.vector"
    assert "s3cret" not in json_line("jdbc:postgresql://u:s3cret@db/x")  # masked too


CHILD = """
import sys
print("plain line", file=sys.stderr, flush=True)
sys.stdin.readline()  # after the parent restored its own stderr
print('{"msg": "json"}', file=sys.stderr, flush=True)
"""

PARENT = """
import subprocess, sys
from pipeline.jvm_stderr import stderr_as_json
with stderr_as_json(True):
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE)
print("after", file=sys.stderr, flush=True)  # this process's own stderr: not wrapped
child.communicate(b"go\\n")
"""


def test_should_give_a_child_started_inside_a_stderr_of_json_lines():
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", PARENT, CHILD], capture_output=True,
                          text=True, timeout=30, check=True, cwd=root)
    lines = done.stderr.splitlines()
    assert "after" in lines, done.stderr
    others = [json.loads(line) for line in lines if line != "after"]
    assert [o["msg"] for o in others] == ["plain line", "json"]
