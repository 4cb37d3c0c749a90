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
# The state (bench/bench_state.h) is "model" (a transformer-like model with its Adam state, of
# about MiB) or "small" (20,000 tensors of 1-64 KiB plus 4 of 32 MiB, 748 MiB whatever MiB).
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
#                      [rounds=4] [state=model]
#
# The scaling curve: the same state saved and loaded (same world size) at each rank count of
# the list, Python DCP beside dcp and the raw disk (one file per rank), one table of ratios:
#
#   bench/run_bench.sh sweep [build_dir=build] [MiB=512] [rounds=2] [state=model] [work_dir]
#                            [ranks="1 2 4 8 16"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE=single
if [[ "${1:-}" == sweep ]]; then
  MODE=sweep
  shift
  BUILD="${1:-$ROOT/build}"
  MIB="${2:-512}"
  ROUNDS="${3:-2}"
  STATE="${4:-model}"
  WORK="${5:-$BUILD/bench_work}"
  SWEEP="${6:-1 2 4 8 16}"
else
  BUILD="${1:-$ROOT/build}"
  MIB="${2:-2048}"
  N="${3:-4}"
  M="${4:-3}"
  WORK="${5:-$BUILD/bench_work}"
  ROUNDS="${6:-4}"
  STATE="${7:-model}"
fi
[[ "$STATE" == model || "$STATE" == small ]] || { echo "run_bench.sh: unknown state '$STATE'" >&2; exit 2; }
PY="$ROOT/.venv/bin/python"
source "$ROOT/tools/mpi_env.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$WORK/results.txt"
: > "$LOG"
# run <case> <ranks> <command...>: the command's RESULT lines, tagged with the case and ranks.
run() {
  local name=$1 ranks=$2; shift 2
  echo "== $name ($ranks ranks)" >&2
  "$@" | grep '^RESULT' | sed "s/^RESULT/RESULT case=$name ranks=$ranks/" | tee -a "$LOG" >&2
}
DCP_FLAGS=""
[[ "$STATE" == small ]] && DCP_FLAGS="small"

cold() { find "$1" -type f -exec "$BUILD/bench/raw_disk_bench" cold {} +; }
py() {
  [[ $2 == load ]] && cold "$WORK/py"
  run "python_$1" "$3" "$PY" "$ROOT/bench/python_dcp_bench.py" "$2" "$WORK/py" "$MIB" "$3" "$STATE"
}
ours() {
  [[ $2 == load ]] && cold "$WORK/cpp"
  run "dcp_$1" "$3" "${MPIRUN[@]}" -np "$3" "$BUILD/bench/dcp_bench" "$2" "$WORK/cpp" "$MIB" 1 $DCP_FLAGS
}
both() {  # both <case> <op> <ranks> <round>: odd rounds Python first, even rounds dcp first
  if (( $4 % 2 )); then py "$1" "$2" "$3"; ours "$1" "$2" "$3"
  else ours "$1" "$2" "$3"; py "$1" "$2" "$3"; fi
}
raw() {  # raw <ranks>: the raw disk on as many bytes as dcp's checkpoint, one file per rank
  local bytes
  bytes=$(du -sb "$WORK/cpp" | cut -f1)
  rm -rf "$WORK/py" "$WORK/cpp"
  run raw "$1" "$BUILD/bench/raw_disk_bench" "$WORK" "$bytes" "$1"
}
for round in $(seq "$ROUNDS"); do
  echo "=== round $round of $ROUNDS" >&2
  if [[ $MODE == sweep ]]; then
    for n in $SWEEP; do
      rm -rf "$WORK/py" "$WORK/cpp"
      both save save "$n" "$round"
      both load load "$n" "$round"
      raw "$n"
    done
  else
    rm -rf "$WORK/py" "$WORK/cpp"
    both save save "$N" "$round"
    both load load "$N" "$round"
    both reshard load "$M" "$round"
    raw "$N"
  fi
done

if [[ $MODE == sweep ]]; then
  exec "$PY" "$ROOT/bench/bench_report.py" sweep "$LOG" "$ROUNDS" "$STATE"
fi
exec "$PY" "$ROOT/bench/bench_report.py" single "$LOG" "$ROUNDS" "$STATE" "$N" "$M"
