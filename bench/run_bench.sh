#!/usr/bin/env bash
# The benchmark harness: on the same data and world size, in one go,
#   Python DCP (torch 2.13 from the repo's venv, gloo processes): save; load at the same world
#   size; load at another world size (resharding);
#   dcp (mpirun): the same three;
#   the raw disk: O_DIRECT sequential write and read of the same byte count (the read also
#   with 8 requests in flight per file, see bench/raw_disk_bench.cpp);
# then prints wall time, GB/s, peak RSS overhead per rank, bytes read against bytes needed, and
# the ratios dcp / Python and dcp / raw disk.
#
# Caches: every load reads cold files. The loaders evict the files from the guest's page cache,
# and before every load the harness rewrites the checkpoint's files with O_DIRECT
# (`raw_disk_bench cold`). Without that, what sits below the guest is unequal: on the
# development VM the host caches what the guest writes through its page cache (Python DCP's
# buffered writes) but not what it writes with O_DIRECT (dcp's and the raw baseline's), and it
# caches what was read once. A first load of Python's files then came from memory and dcp's
# from the disk; a resharding load after a same-world load read cached bytes.
#
# The disk's speed drifts during a run, and what ran just before a case changes what the host
# (below the guest's page cache) still caches. So every case runs `rounds` times, Python and
# dcp taking turns to go first, and the table reports each case's median time (with the
# fastest and slowest run).
#
#   bench/run_bench.sh [build_dir=build] [MiB=2048] [ranks=4] [reshard_ranks=3] [work_dir]
#                      [rounds=4]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
MIB="${2:-2048}"
N="${3:-4}"
M="${4:-3}"
WORK="${5:-$BUILD/bench_work}"
ROUNDS="${6:-4}"
PY="$ROOT/.venv/bin/python"
source "$ROOT/tools/mpi_env.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$WORK/results.txt"
: > "$LOG"
run() { local name=$1; shift; echo "== $name" >&2; "$@" | grep '^RESULT' | sed "s/^RESULT/RESULT case=$name/" | tee -a "$LOG" >&2; }

cold() { find "$1" -type f -exec "$BUILD/bench/raw_disk_bench" cold {} +; }
py() {
  [[ $2 == load ]] && cold "$WORK/py"
  run "python_$1" "$PY" "$ROOT/bench/python_dcp_bench.py" "$2" "$WORK/py" "$MIB" "$3"
}
ours() {
  [[ $2 == load ]] && cold "$WORK/cpp"
  run "dcp_$1" "${MPIRUN[@]}" -np "$3" "$BUILD/bench/dcp_bench" "$2" "$WORK/cpp" "$MIB"
}
both() {  # both <case> <op> <ranks> <round>: odd rounds Python first, even rounds dcp first
  if (( $4 % 2 )); then py "$1" "$2" "$3"; ours "$1" "$2" "$3"
  else ours "$1" "$2" "$3"; py "$1" "$2" "$3"; fi
}
for round in $(seq "$ROUNDS"); do
  echo "=== round $round of $ROUNDS" >&2
  rm -rf "$WORK/py" "$WORK/cpp"
  both save save "$N" "$round"
  both load load "$N" "$round"
  both reshard load "$M" "$round"
  BYTES=$(du -sb "$WORK/cpp" | cut -f1)
  rm -rf "$WORK/py" "$WORK/cpp"
  run raw "$BUILD/bench/raw_disk_bench" "$WORK" "$BYTES" "$N"
done

"$PY" - "$LOG" "$N" "$M" "$ROUNDS" <<'PYEOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kv = dict(p.split("=", 1) for p in line.split()[1:])
    runs.setdefault(kv["case"] + ("_" + kv["op"] if kv["case"] == "raw" else ""), []).append(kv)
n, m, rounds = sys.argv[2], sys.argv[3], sys.argv[4]
def median_run(rs):  # a middle run, with the median time (the mean of the middle two)
    ordered = sorted(rs, key=lambda r: float(r["seconds"]))
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["seconds"] = str(statistics.median(float(r["seconds"]) for r in rs))
    return row
rows = {k: median_run(v) for k, v in runs.items()}
def gbps(r): return float(r["bytes"]) / float(r["seconds"]) / 1e9
print(f"\nmedian of {rounds} rounds per case (fastest - slowest run in brackets)")
print(f"{'case':<28}{'wall s':>9}{'(min - max)':>16}{'GB/s':>8}{'peak RSS +MiB/rank':>20}{'read/needed':>13}")
for key, label in [("python_save", f"Python DCP save ({n})"), ("dcp_save", f"dcp save ({n})"),
                   ("python_load", f"Python DCP load ({n})"), ("dcp_load", f"dcp load ({n})"),
                   ("python_reshard", f"Python DCP load ({n}->{m})"), ("dcp_reshard", f"dcp load ({n}->{m})"),
                   ("raw_raw_write", "raw O_DIRECT write"), ("raw_raw_read", "raw O_DIRECT read"),
                   ("raw_raw_read_deep", "raw read, 8 in flight")]:
    r = rows.get(key)
    if not r: continue
    times = [float(x["seconds"]) for x in runs[key]]
    spread = f"({min(times):.2f} - {max(times):.2f})"
    ratio = (f"{float(r['read_bytes'])/float(r['bytes']):.2f}x"
             if "read_bytes" in r and r["op"] == "load" else "")
    rss = max((x.get("peak_rss_overhead_mib", "") for x in runs[key]), key=lambda v: float(v or 0))
    print(f"{label:<28}{float(r['seconds']):>9.2f}{spread:>16}{gbps(r):>8.2f}{rss:>20}{ratio:>13}")
print()
for op, py, ours, raw in [("save", "python_save", "dcp_save", "raw_raw_write"),
                          ("load", "python_load", "dcp_load", "raw_raw_read"),
                          ("reshard load", "python_reshard", "dcp_reshard", "raw_raw_read")]:
    if py in rows and ours in rows:
        line = f"{op:<14} dcp / Python throughput: {gbps(rows[ours])/gbps(rows[py]):.2f}x"
        if raw in rows:
            line += f"   dcp / raw disk: {gbps(rows[ours])/gbps(rows[raw]):.2f}"
        if op != "save" and "raw_raw_read_deep" in rows:
            line += f" ({gbps(rows[ours])/gbps(rows['raw_raw_read_deep']):.2f} against 8 in flight)"
        print(line)
if any(r.get("direct") == "0" for r in runs.get("raw_raw_write", [])):
    print("(the file system refused O_DIRECT: the raw baseline is buffered IO + fsync)")
PYEOF
