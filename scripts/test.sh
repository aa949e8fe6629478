#!/usr/bin/env bash
# Install into .venv and run the whole suite: ruff, mypy --strict, pytest (asyncio and trio).
# Extra arguments go to pytest (for example: scripts/test.sh -k lifecycle -x).
# Then run a core subset again in .venv-floor, against the oldest redis-py that pyproject.toml
# allows, to prove that floor still works, and on each other supported Python (3.12, 3.13) in
# .venv-py312 / .venv-py313. A supported Python that cannot be found fails the run.
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
# The schedule clock test restarts a server under a clock set back: Debian's faketime.
if ! command -v faketime >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "== installing faketime"
  (apt-get update -qq && apt-get install -y -qq faketime) >/dev/null 2>&1 || echo "could not install faketime"
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
  tests/test_connections.py tests/test_transport.py tests/test_results.py \
  tests/test_native_transport.py

# The other supported Pythons (the classifiers in pyproject.toml): the core subset covers the
# lifecycle, the Lua scripts, every executor, faults, results and the transport, on asyncio and
# trio, and typed handlers (mypy on user code). On 3.13 the Django tests run too, on Django 6
# and its built-in django.tasks (the main run has Django 5.2 and the django-tasks package).
# The interpreter comes from PATH (python3.12) or pyenv's versions directory.
core_subset=(tests/test_lifecycle.py tests/test_scripts.py tests/test_executors.py
             tests/test_faults.py tests/test_results.py tests/test_transport.py
             tests/test_typing.py tests/test_native_transport.py)

find_python() {  # find_python 3.12: the path of a CPython 3.12 interpreter, or nothing
  local wanted=$1 candidate
  for candidate in "$(command -v "python$wanted" 2>/dev/null || true)" \
      $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$wanted".*/bin/python 2>/dev/null | sort -rV); do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && [ "$("$candidate" -c \
        'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$wanted" ]; then
      echo "$candidate"
      return
    fi
  done
}

for minor in 3.12 3.13; do
  venv=".venv-py${minor/./}"
  python=$(find_python "$minor")
  if [ -z "$python" ]; then
    echo "Python $minor not found (neither python$minor on PATH nor a pyenv version):" \
      "it is a supported Python, install it (pyenv install $minor)" >&2
    exit 1
  fi
  echo "== pytest, core subset, on Python $minor ($python)"
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  packages=(-e ".[dev,trio,embedded]")
  files=("${core_subset[@]}")
  if [ "$minor" = 3.13 ]; then
    packages+=("django>=6,<7")
    files+=(tests/test_django.py)
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}"
  "$venv/bin/pytest" -q -p no:cacheprovider "${files[@]}"
done
