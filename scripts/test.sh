#!/usr/bin/env bash
# Install into .venv and run the whole suite: ruff, mypy --strict, pytest (asyncio and trio).
# Extra arguments go to pytest (for example: scripts/test.sh -k lifecycle -x).
# Then run a core subset again in .venv-floor, against the oldest redis-py that pyproject.toml
# allows, to prove that floor still works.
set -euo pipefail
source "$(dirname "$0")/_venv.sh" "dev,trio,hiredis,embedded,spark,tui,metrics,otel,dashboard,django"
# The terminal-view test drives `panqueue top` in a real terminal: tmux (a Debian package).
if ! command -v tmux >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "== installing tmux"
  (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 || echo "could not install tmux"
fi
# The dashboard's browser tests drive Debian's chromium (nothing here downloads a browser build).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "== installing chromium"
  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "could not install chromium"
fi
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy --strict panqueue"
.venv/bin/mypy --strict panqueue
echo "== pytest"
.venv/bin/pytest "$@"

floor=$(sed -n 's/^ *"redis>=\([0-9][0-9.]*\)",*$/\1/p' pyproject.toml)
if [ -z "$floor" ]; then
  echo "cannot read the redis floor (\"redis>=X\") from pyproject.toml" >&2
  exit 1
fi
echo "== pytest, core subset, with the oldest supported redis-py ($floor)"
if [ ! -x .venv-floor/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv-floor
fi
.venv-floor/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,trio,embedded]" \
  "redis==$floor"
.venv-floor/bin/pytest -q -p no:cacheprovider tests/test_lifecycle.py tests/test_cluster.py \
  tests/test_connections.py tests/test_transport.py tests/test_results.py
