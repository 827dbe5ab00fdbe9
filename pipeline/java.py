"""Find a Java runtime Spark can boot on, and say exactly what to do when there is none.

Why check ourselves: without Java, PySpark fails deep inside its launcher with
``JAVA_GATEWAY_EXITED`` and a screen of output that never says "install Java". The check
costs one ``java -version`` (~0.1 s) before a JVM start that costs ~8 s anyway.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from icefloe.errors import IcefloeError

SUPPORTED = (17, 21)
ADVICE = ("install Java 17 (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`; "
          "`make up` does it for you) or point JAVA_HOME at a Java 17/21 installation")


class JavaMissingError(IcefloeError):
    """No usable Java: Spark (the collector, ``icefloe query``) cannot start."""


def find_java(env: Mapping[str, str] = os.environ) -> Path | None:
    """``$JAVA_HOME/bin/java`` when JAVA_HOME is set (that is what Spark uses), else PATH."""
    home = env.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return candidate if os.access(candidate, os.X_OK) else None
    found = shutil.which("java", path=env.get("PATH"))
    return Path(found) if found else None


def java_version(java: Path) -> int | None:
    """The feature version (17, 21, ...) that ``java -version`` reports, None if unreadable."""
    try:
        done = subprocess.run([str(java), "-version"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def require_java(env: Mapping[str, str] = os.environ) -> Path:
    """The java executable, or a one-line :class:`JavaMissingError` saying what to do."""
    java = find_java(env)
    if java is None:
        where = (f"JAVA_HOME={env['JAVA_HOME']} has no bin/java" if env.get("JAVA_HOME")
                 else "no `java` on PATH and JAVA_HOME is not set")
        raise JavaMissingError(f"Java not found ({where}); Spark needs it: {ADVICE}")
    version = java_version(java)
    if version is None or version < SUPPORTED[0]:
        seen = f"Java {version}" if version else "an unrecognised Java"
        raise JavaMissingError(f"{java} is {seen}; Spark 4 needs Java 17 or newer: {ADVICE}")
    return java
