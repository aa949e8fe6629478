#!/usr/bin/env bash
# Install into .venv and run the whole suite: ruff, mypy --strict, pytest (asyncio and trio).
# Extra arguments go to the main pytest run (for example: scripts/test.sh -k lifecycle -x, or
# scripts/test.sh --long for the full endurance runs; see tests/bounds.py).
#
# Four legs run at the same time, each into a log of its own, printed whole once it ends (with
# its exit status and time); the script fails if any leg fails (pytest's exit 5, no test
# collected, included):
#   lint    ruff, then mypy --strict panqueue.
#   main    the whole suite on .venv's Python with the newest dependencies, on pytest-xdist
#           workers (-n $PYTEST_WORKERS, default 6: most tests wait on servers and processes
#           more than they compute; tests/conftest.py keeps a module with a module-scoped
#           fixture on one worker and hands the slowest tests out first). --durations=15.
#   py3.12  Python 3.12 with the oldest version that pyproject.toml allows of every core
#           dependency (each "name>=X" of [project] dependencies, installed as name==X), in
#           .venv-py312: the core subset (below) and the tests that drive redis-py itself
#           beyond it (connections and errors, the cluster client). One leg proves both the
#           floors and the Python: the newest dependencies run on 3.11 and 3.13.
#   py3.13  Python 3.13 with the newest dependencies, in .venv-py313: what differs there, the
#           Django tests and the ported suites of tests/django_port on Django 6 and its built-in
#           django.tasks (the main run has Django 5.2 and the django-tasks package), and the
#           lifecycle on both event loops of the newest interpreter.
# The core subset is what depends on the interpreter, on asyncio and trio: the lifecycle, every
# executor, faults and cancellation, results, the transports, and typed handlers (mypy on user
# code). It runs on the oldest (3.11, main) and on 3.12 with the floors; the newest gets its
# lifecycle only, as each leg's time comes out of the same two cores. The Lua scripts' own
# tests run in the main leg only: the scripts run in the server, the same whatever the
# client's Python. The interpreters come from PATH (python3.12) or pyenv's versions
# directory; a supported Python that cannot be found fails the run.
set -euo pipefail
# Bytecode is cached (in __pycache__, ignored by git) even where the environment asks Python not
# to write it: the suite starts about a thousand Python processes (workers, the CLI, examples),
# and without the cache each compiles panqueue and the tests again (about 0.2 s of CPU apiece).
unset PYTHONDONTWRITEBYTECODE
# Debian packages some tests drive, installed (as root) while the virtual environment is made:
# tmux (the terminal view's test drives `panqueue top` in a real terminal), chromium (the
# dashboard's browser tests: nothing here downloads a browser build) and faketime (the schedule
# clock test restarts a server under a clock set back). One `apt-get update` for all of them.
debian_packages() {
  local missing=() name
  for name in tmux chromium faketime; do
    command -v "$name" >/dev/null 2>&1 || missing+=("$name")
  done
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    echo "== installing ${missing[*]}"
    (apt-get update -qq && apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
      || echo "could not install ${missing[*]}"
  fi
}
debian_packages &
packages_pid=$!
source "$(dirname "$0")/_venv.sh" "dev,trio,hiredis,embedded,spark,tui,metrics,otel,dashboard,django"
wait "$packages_pid"

# The floors: name==X for each "name>=X" (or "name>=X,<Y") of [project] dependencies. A
# dependency without one fails the run: every core dependency states the oldest it works with.
floors=$(.venv/bin/python - <<'EOF'
import re, sys, tomllib
with open("pyproject.toml", "rb") as file:
    dependencies = tomllib.load(file)["project"]["dependencies"]
for dependency in dependencies:
    floor = re.fullmatch(r"([A-Za-z0-9._-]+)>=([0-9][0-9.]*)(,<[0-9.]+)?", dependency)
    if floor is None:
        sys.exit(f"pyproject.toml: no floor (name>=X) in the dependency {dependency!r}")
    print(f"{floor[1]}=={floor[2]}")
EOF
)
read -r -d '' -a floors <<<"$floors" || true

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

# Each leg, as a function run in the background with its output in a log.
leg_lint() {
  echo "== ruff"
  .venv/bin/ruff check .
  echo "== mypy --strict panqueue"
  .venv/bin/mypy --strict panqueue
}

leg_main() {
  echo "== pytest, the whole suite, ${PYTEST_WORKERS:-6} workers"
  # A worker that dies (killed, out of memory) fails the run with its test named; replacing
  # it ends the grouped scheduler in an INTERNALERROR that hides every other result.
  .venv/bin/pytest -n "${PYTEST_WORKERS:-6}" --dist loadgroup --max-worker-restart 0 \
    --durations=15 "$@"
}

core_subset=(tests/test_lifecycle.py tests/test_executors.py tests/test_faults.py
             tests/test_results.py tests/test_transport.py tests/test_typing.py
             tests/test_native_transport.py)

leg_python() {  # leg_python 3.13
  local minor=$1 venv=".venv-py${1/./}" python
  python=$(find_python "$minor")
  if [ -z "$python" ]; then
    echo "Python $minor not found (neither python$minor on PATH nor a pyenv version):" \
      "it is a supported Python, install it (pyenv install $minor)" >&2
    return 1
  fi
  local packages=(-e ".[dev,trio,embedded]") files
  if [ "$minor" = 3.12 ]; then
    echo "== pytest, core subset and redis-py's, on Python $minor ($python), floors: ${floors[*]}"
    packages+=("${floors[@]}")
    files=("${core_subset[@]}" tests/test_connections.py tests/test_cluster.py)
  else
    echo "== pytest, the lifecycle and Django 6, on Python $minor ($python)"
    packages+=("django>=6,<7")
    files=(tests/test_lifecycle.py tests/test_django.py tests/django_port)
  fi
  # uv (installed in .venv by _venv.sh) makes these environments in seconds.
  if [ ! -x "$venv/bin/python" ]; then
    .venv/bin/uv venv --quiet --python "$python" "$venv"
  fi
  .venv/bin/uv pip install --quiet --python "$venv/bin/python" "${packages[@]}"
  "$venv/bin/python" -c "import redis; print('redis-py', redis.__version__)"
  # Few workers: the main leg's six already hold both cores. The 3.12 leg's tests mostly wait
  # (on servers, child processes, timeouts: 400-500 s on one worker, as long as the main leg),
  # so it gets two (about 190 s); the 3.13 leg one (about 230 s): both end well before the
  # main leg.
  local workers=1
  if [ "$minor" = 3.12 ]; then
    workers=2
  fi
  "$venv/bin/pytest" -n "$workers" --dist loadgroup -q -p no:cacheprovider --durations=5 \
    "${files[@]}"
}

logs=$(mktemp -d "${TMPDIR:-/tmp}/panqueue-test.XXXXXX")
legs=(lint main py3.12 py3.13)
declare -A leg_of
for leg in "${legs[@]}"; do
  (
    trap 'echo "$SECONDS" >"$logs/$leg.end"' EXIT
    case $leg in
      lint) leg_lint ;;
      main) leg_main "$@" ;;
      py3.*) leg_python "${leg#py}" ;;
    esac
  ) >"$logs/$leg.log" 2>&1 </dev/null &
  leg_of[$!]=$leg
done
echo "== running at once: ${legs[*]} (logs in $logs); each is printed when it ends"

# Print each leg as it ends, with its exit status.
failed=()
for _ in "${legs[@]}"; do
  status=0
  wait -n -p done_pid || status=$?
  leg=${leg_of[$done_pid]}
  echo
  echo "==================== $leg: exit $status after $(cat "$logs/$leg.end" 2>/dev/null || echo "$SECONDS") s"
  cat "$logs/$leg.log"
  echo "==================== end of $leg: exit $status"
  if [ "$status" != 0 ]; then
    failed+=("$leg (exit $status)")
  fi
done
echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED after $SECONDS s: ${failed[*]} (logs in $logs)" >&2
  exit 1
fi
rm -rf "$logs"
echo "all legs passed in $SECONDS s: ${legs[*]}"
