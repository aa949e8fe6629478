#!/bin/bash
# A same-call A/B of the scale-out benchmark (../shared/bench/scaleout, README there): this
# checkout's panqueue/ against BASE's, in passes that alternate the two, on a host with many
# cores where nothing can be installed. Run from the project root here:
#
#   scripts/scaleout_ab.sh BASE
#
# It runs the benchmark's prepare.sh (.devbench/: wheels, scripts, this checkout's panqueue/),
# adds BASE's panqueue/ beside it and writes .devbench/ab.sh. On the big host, from the project
# root with .devbench/ copied along: `bash .devbench/ab.sh` (environment: RUNS, the passes, by
# default "base1 new1 base2 new2"; KS, the master counts, default 1,4,6; BUDGET, seconds per
# pass, default 95). Each pass leaves results.md and results.json in $OUT/<pass>/ and prints its
# table's main columns.
#
# The benchmark's copy counts a partition's waiting jobs from the priority set alone; the
# default priority's jobs wait in the wait list, so the copy here counts both.
set -euo pipefail
base=${1:?usage: scripts/scaleout_ab.sh BASE}
[ -d panqueue ] || { echo "run from the project root" >&2; exit 2; }
git rev-parse --verify -q "$base^{commit}" >/dev/null || { echo "not a commit: $base" >&2; exit 2; }
bash ../shared/bench/scaleout/prepare.sh
# croniter now needs python-dateutil (and it six and tzdata), anyio idna: the wheels that
# prepare.sh downloads leave them out.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .devbench/wheels python-dateutil six tzdata idna
mv .devbench/src .devbench/src_new
mkdir -p .devbench/src_base
git archive "$base" panqueue | tar -x -C .devbench/src_base
git rev-parse --short "$base" > .devbench/BASE
sed -i 's/int(c.zcard(keys.wait))))/int(c.zcard(keys.wait)) + int(c.llen(keys.wait_list))))/' \
  .devbench/scaleout_bench.py
grep -q 'keys.wait_list' .devbench/scaleout_bench.py || { echo "scaleout_bench.py changed: see the note above" >&2; exit 1; }
# Each master's INFO commandstats around the drain too (masters_detail[].commands in
# results.json: calls and µs per command), so that a master's CPU per job can be read as the
# work it did (script calls, stream appends per job) and what each unit of it cost.
python3 - .devbench/scaleout_bench.py <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
edits = [
    ("def cpu_layout()", """def info_cmd(port: int) -> dict[str, list[int]]:
    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        st = c.info("commandstats")
        return {k[len("cmdstat_"):]: [int(v["calls"]), int(v["usec"])] for k, v in st.items()}
    finally:
        c.close()


def cpu_layout()"""),
    ('"servers_info": [info_cpu(s.port) for s in servers],',
     '"servers_info": [info_cpu(s.port) for s in servers],\n'
     '                        "servers_cmd": [info_cmd(s.port) for s in servers],'),
    ("if my_jobs else None)})",
     "if my_jobs else None),\n"
     "                \"commands\": {k: [v[0] - s0[\"servers_cmd\"][i].get(k, [0, 0])[0],\n"
     "                                 v[1] - s0[\"servers_cmd\"][i].get(k, [0, 0])[1]]\n"
     "                             for k, v in s1[\"servers_cmd\"][i].items()\n"
     "                             if v[0] != s0[\"servers_cmd\"][i].get(k, [0, 0])[0]}})"),
]
for old, new in edits:
    if text.count(old) != 1:
        sys.exit(f"scaleout_bench.py changed: {old!r} is not there once")
    text = text.replace(old, new)
open(path, "w").write(text)
PATCH
cat > .devbench/ab.sh <<'AB'
#!/bin/bash
# Passes of the scale-out benchmark alternating BASE's panqueue and the checkout's.
set -u
cd "$(dirname "$0")/.."
DB=.devbench
for run in ${RUNS:-base1 new1 base2 new2}; do
  side=${run%[0-9]}
  rm -rf $DB/src && cp -r $DB/src_$side $DB/src
  if [ "$side" = base ]; then commit=$(cat $DB/BASE); else commit=$(cat $DB/COMMIT); fi
  OUT=$OUT/$run PANQUEUE_COMMIT=$commit bash $DB/run.sh "${BUDGET:-95}" --ks "${KS:-1,4,6}" \
    --no-typical-name --target-s 5 --first-n 100000 >/dev/null 2>&1
  echo "== $run ($commit): run | jobs/s | efficiency | Redis us/job per master | workers us/job"
  grep -E "^\| (standalone|K)" "$OUT/$run/results.md" | cut -d"|" -f2,8,10,12,14
  python3 - "$OUT/$run/results.json" <<'CALLS'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    masters = [m for m in r.get("masters_detail", []) if m["jobs"] > 1]
    if masters:
        calls = " / ".join(f"{m['commands'].get('fcall', [0, 0])[0] / m['jobs']:.4f}" for m in masters)
        print(f" {r['label']}: script calls per job per master {calls}")
CALLS
  rm -f "$OUT/$run/logs.tar.gz" "$OUT/$run/driver.log"
done
AB
chmod +x .devbench/ab.sh
du -sh .devbench
