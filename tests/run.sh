#!/usr/bin/env bash
# Install what the tests need into .venv and run the whole suite: lint, types, tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RMQ_VENV:-$here/.venv}"
cd "$here"
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "error: Java is not installed; the Spark tests need a Java 17 runtime." >&2
  exit 1
fi
# What installs from elsewhere than PyPI runs in the background, each with its log under build/,
# while pip installs the project: a step that fails prints its log and fails the run.
mkdir -p build
background=()
# the report test opens the HTML report in headless Chromium: Debian's chromium package
if ! command -v chromium >/dev/null 2>&1; then
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  echo "installing Debian's chromium (the report test renders the report headless)"
  { $as_root apt-get update -qq && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >build/chromium.log 2>&1 &
  background+=("$!:build/chromium.log")
fi
# the Node.js test runs the official client from npm (rocketmq-client-nodejs), installed once here
node_client="$here/build/node-client"
if command -v npm >/dev/null 2>&1 && [ ! -d "$node_client/node_modules/rocketmq-client-nodejs" ]; then
  echo "installing the official RocketMQ 5 Node.js client from npm (the Node.js test runs it)"
  mkdir -p "$node_client"
  (cd "$node_client" && npm install --silent --no-audit --no-fund --ignore-scripts rocketmq-client-nodejs@1.0.8) >build/node-client.log 2>&1 &
  background+=("$!:build/node-client.log")
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[test]"
# The suite runs once per lake engine (RMQ_TEST_ENGINES, both by default): on the bridge every test,
# on delta-spark the Spark tests marked both_engines (RMQ_TEST_SCOPE=all: every Spark test), a
# seeded differential's first seed on delta-spark and its others on the bridge; the
# slowest tests of each run are listed at its end. The JVM jars the tests run are fetched once,
# from Maven Central, in the background while the lint and the type checks run: the Delta jars of
# the delta-spark engine into Ivy's cache, and Apache RocketMQ's jars (with its traffic driver
# compiled against them) under build/apache-rocketmq.
engines="${RMQ_TEST_ENGINES:-bridge delta-spark}"
if [[ " $engines " == *" delta-spark "* ]]; then
  echo "fetching the Delta jars of the delta-spark engine (once; then from Ivy's cache)"
  "$venv/bin/python" -c "from jobs.lake import build_session; build_session('fetch-delta', master='local[1]', engine='delta-spark').stop()" >build/delta-jars.log 2>&1 &
  background+=("$!:build/delta-jars.log")
fi
if [[ " $engines " == *" bridge "* ]]; then
  echo "fetching Apache RocketMQ's jars (once; then from Maven's local repository)"
  "$venv/bin/python" -c "from tests.apache_rocketmq import ensure_driver; ensure_driver()" >build/apache-jars.log 2>&1 &
  background+=("$!:build/apache-jars.log")
fi
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" --strict broker_model schemas jobs
for step in "${background[@]}"; do
  if ! wait "${step%%:*}"; then
    cat "${step#*:}" >&2
    exit 1
  fi
done
for engine in $engines; do
  echo "== the tests on the $engine engine"
  # two workers (RMQ_TEST_WORKERS), each with its own Spark session; a test module stays on one worker
  RMQ_TEST_ENGINE="$engine" "$venv/bin/python" -m pytest -n "${RMQ_TEST_WORKERS:-2}" --dist loadfile --durations=12 "$@"
done
