# Sourced by test.sh and demo.sh: make .venv and install the project with the given extras.
# The packages are installed by uv (installed into .venv by pip the first time): it resolves and
# installs in seconds where pip takes most of a minute, and test.sh makes three environments.
# .venv keeps its own pip (tests/test_packaging.py installs a built wheel with it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check uv
fi
.venv/bin/uv pip install --quiet --python .venv/bin/python -e ".[$1]"
