# Sourced by test.sh and demo.sh: make .venv and install the project with the given extras.
# uv installs them (seconds where pip takes most of a minute). pip installs uv itself, and
# PySpark where the extras name spark: PySpark has no wheel, and pip builds it once into its
# cache where uv would build it again on every install. .venv keeps pip for the tests that use it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
first=()
if [ ! -x .venv/bin/uv ]; then
  first+=(uv)
fi
if [[ ",$1," == *,spark,* ]] && [ ! -d .venv/lib/python3*/site-packages/pyspark ]; then
  first+=("$(grep -o '"pyspark[^"]*"' pyproject.toml | tr -d '"')")
fi
if [ ${#first[@]} -gt 0 ]; then
  .venv/bin/python -m pip install -qq --disable-pip-version-check "${first[@]}"
fi
.venv/bin/uv pip install --quiet --python .venv/bin/python -e ".[$1]"
