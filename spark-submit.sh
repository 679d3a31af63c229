#!/usr/bin/env bash
# Run a job with spark-submit:  ./spark-submit.sh [spark-submit flags] <job> [job options]
#
# Packages broker_model, jobs and schemas for --py-files, runs on local[*] unless --master is
# given, and passes every spark-submit flag through (--master, --conf, --packages, ...). With
# Delta jars on the classpath (--packages io.delta:delta-spark_2.13:...) the delta-spark engine is
# configured; otherwise the jobs use the bridge engine. On first use it creates .venv and installs
# the project into it.
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
if [ "$delta_jars" = 1 ]; then
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
exec "$venv/bin/spark-submit" "${submit_args[@]}" --py-files "$bundle" "$here/jobs/__main__.py" "$@"
