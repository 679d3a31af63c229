#!/usr/bin/env bash
# Run a job with spark-submit:  ./spark-submit.sh [spark-submit flags] <job> [job options]
#
# Packages broker_model, jobs and schemas for --py-files, runs on local[*] unless --master is
# given, and passes every spark-submit flag through (--master, --conf, --packages, ...). The
# delta-spark engine is configured when the job asks for it (--engine delta-spark, or --conf
# spark.rmq.lake.engine=delta-spark) or Delta jars are given (--packages io.delta:...): the Delta
# jar of the installed delta-spark package is fetched from Maven Central by Ivy (cached in Ivy's
# home after the first time), as delta's configure_spark_with_delta_pip would; once a start has
# recorded the jars Ivy resolved, they are given with --jars, without a resolution, unless the flags
# set Ivy or jars of their own (jobs.lake.session.delta_submit_flags). On first use it creates .venv
# and installs the project into it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${RMQ_VENV:-$here/.venv}"

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "error: Java is not installed. Spark needs a Java 17 runtime: install one (for example" \
       "'apt-get install openjdk-17-jre-headless') or set JAVA_HOME, then run this again." >&2
  exit 1
fi

if ! "$venv/bin/python" -c "import pyspark, deltalake, broker_model" >/dev/null 2>&1; then
  echo "setting up $venv (first run only) ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e "$here"
fi

# Split the arguments: spark-submit flags come before the job name.
no_value_flags=" --verbose -v --supervise --help -h --version --usage-error "
submit_args=()
has_master=0
delta_jars=0
while [ $# -gt 0 ]; do
  case "$1" in
    -*)
      [ "$1" = "--master" ] || [[ "$1" == --master=* ]] && has_master=1
      [[ "$1" == *io.delta* ]] && delta_jars=1
      if [[ "$no_value_flags" == *" $1 "* ]] || [[ "$1" == *=* ]]; then
        submit_args+=("$1"); shift
      else
        [ $# -ge 2 ] || { echo "error: spark-submit flag $1 needs a value" >&2; exit 2; }
        [[ "$2" == *io.delta* ]] && delta_jars=1
        submit_args+=("$1" "$2"); shift 2
      fi
      ;;
    *) break ;;
  esac
done
# the job's own options may ask for the delta-spark engine
for arg in "$@"; do
  if [ "$delta_jars" = 0 ] && { [ "$arg" = "--engine=delta-spark" ] || { [ "$arg" = "delta-spark" ] && [ "${previous:-}" = "--engine" ]; }; }; then
    delta_jars=2
  fi
  previous="$arg"
done
[[ " ${submit_args[*]:-} " == *"spark.rmq.lake.engine=delta-spark"* ]] && [ "$delta_jars" = 0 ] && delta_jars=2
if [ $# -eq 0 ]; then
  echo "usage: ./spark-submit.sh [spark-submit flags] <job> [job options]" >&2
  "$venv/bin/python" -m jobs --help >&2
  exit 2
fi

[ "$has_master" = 1 ] || submit_args=(--master "local[*]" "${submit_args[@]}")
if [[ " ${submit_args[*]} " != *log4j2.configurationFile* ]]; then
  submit_args+=(--driver-java-options "-Dlog4j2.configurationFile=file:$here/jobs/conf/log4j2.properties"
                --conf spark.ui.showConsoleProgress=false)
fi
resolve=0
if [ "$delta_jars" = 2 ]; then  # asked for, no jars given: the ones of the installed delta-spark
  flags="$("$venv/bin/python" -c 'import sys; from jobs.lake.session import delta_submit_flags as f
print("\n".join(f(sys.argv[1:])))' "${submit_args[@]}")"
  mapfile -t delta_flags <<<"$flags"
  submit_args+=("${delta_flags[@]}")
  if [ "${delta_flags[0]}" = "--packages" ]; then
    package="${delta_flags[1]}"
    resolve=1
  fi
fi
if [ "$delta_jars" != 0 ]; then
  submit_args+=(--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
                --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog
                --conf spark.rmq.lake.engine=delta-spark)
fi

mkdir -p "$here/build"
bundle="$here/build/rmq-lake.zip"
"$venv/bin/python" - "$here" "$bundle" <<'PY'
import sys, zipfile
from pathlib import Path
root, bundle = Path(sys.argv[1]), Path(sys.argv[2])
with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
    for package in ("broker_model", "jobs", "schemas"):
        for path in sorted((root / package).rglob("*.py")):
            archive.write(path, path.relative_to(root))
PY

export PYSPARK_PYTHON="$venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$venv/bin/python"
cd "$here"
if [ "$resolve" = 0 ]; then
  exec "$venv/bin/spark-submit" "${submit_args[@]}" --py-files "$bundle" "$here/jobs/__main__.py" "$@"
fi
# fetching the Delta jars may fail (no route to Maven Central): say so plainly after Ivy's messages
ivy_log="$(mktemp)"
trap 'rm -f "$ivy_log"' EXIT
status=0
"$venv/bin/spark-submit" "${submit_args[@]}" --py-files "$bundle" "$here/jobs/__main__.py" "$@" \
  2> >(tee "$ivy_log" >&2) || status=$?
wait
if [ "$status" != 0 ] && grep -q "UNRESOLVED DEPENDENCIES\|unresolved dependency" "$ivy_log"; then
  echo "error: the Delta jars ($package) could not be fetched from Maven Central (Ivy's messages above);" \
       "let this machine reach it once (Ivy caches them), pass local jars with --jars, or run with --engine bridge" >&2
  exit 1
fi
exit "$status"
