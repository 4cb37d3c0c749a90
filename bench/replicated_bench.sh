#!/usr/bin/env bash
# Read once, broadcast (LoadOptions::read_once): a fully replicated state (every tensor whole on
# every rank, as DDP holds it) saved on N ranks, then loaded on the same N ranks with read-once
# broadcasts and with per-rank reads ("noshare"), taking turns, `rounds` times. Every load reads
# cold files (rewritten with O_DIRECT and evicted, as in run_bench.sh). Prints each load's time
# and the bytes all ranks read from storage against the checkpoint's size, then the medians.
# Both of Open MPI's shared-memory transports are measured: copy-in/copy-out ("none", what
# tools/mpi_env.sh sets, since containers often forbid the other) and single-copy "cma"
# (process_vm_readv), skipped where it does not work.
#
#   bench/replicated_bench.sh [build_dir=build] [MiB=1024] [ranks=8] [rounds=3] [work_dir]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
MIB="${2:-1024}"
N="${3:-8}"
ROUNDS="${4:-3}"
WORK="${5:-$BUILD/bench_replicated}"
source "$ROOT/tools/mpi_env.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$WORK/results.txt"
: > "$LOG"
bench() { "${MPIRUN[@]}" -np "$N" "$BUILD/bench/dcp_bench" "$@" | grep '^RESULT'; }
transports=(none)
if OMPI_MCA_btl_vader_single_copy_mechanism=cma "${MPIRUN[@]}" -np 2 "$BUILD/bench/dcp_bench" \
     save "$WORK/probe" 16 >/dev/null 2>&1; then
  transports+=(cma)
fi
rm -rf "$WORK/probe"
cold() { find "$WORK/ckpt" -type f -exec "$BUILD/bench/raw_disk_bench" cold {} +; }

bench save "$WORK/ckpt" "$MIB" 1 replicated | tee -a "$LOG"
for round in $(seq "$ROUNDS"); do
  for t in "${transports[@]}"; do
    for mode in $( ((round % 2)) && echo "once noshare" || echo "noshare once"); do
      cold
      flags=replicated; [[ $mode == noshare ]] && flags=replicated,noshare
      OMPI_MCA_btl_vader_single_copy_mechanism=$t bench load "$WORK/ckpt" "$MIB" 1 "$flags" |
        sed "s/^RESULT/RESULT mode=$mode transport=$t/" | tee -a "$LOG"
    done
  done
done

python3 - "$LOG" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(p.split("=", 1) for p in line.split()[1:])
    if kv["op"] == "load":
        rows.setdefault((kv["transport"], kv["mode"]), []).append(kv)
print(f"\n{'load (MPI transport)':<34}{'median s':>10}{'(min - max)':>16}{'read / checkpoint':>20}{'+MiB/rank':>11}")
for t in ("none", "cma"):
    for mode, label in [("once", "read once, broadcast"), ("noshare", "every rank reads")]:
        rs = rows.get((t, mode), [])
        if not rs: continue
        s = [float(r["seconds"]) for r in rs]
        ratio = statistics.median(float(r["read_bytes"]) / float(r["checkpoint_bytes"]) for r in rs)
        rss = max(float(r["peak_rss_overhead_mib"]) for r in rs)
        print(f"{label + ' (' + t + ')':<34}{statistics.median(s):>10.2f}{f'({min(s):.2f} - {max(s):.2f})':>16}{ratio:>19.2f}x{rss:>11.1f}")
    if rows.get((t, "once")) and rows.get((t, "noshare")):
        a = statistics.median(float(r["seconds"]) for r in rows[(t, "noshare")])
        b = statistics.median(float(r["seconds"]) for r in rows[(t, "once")])
        print(f"  {t}: per-rank reads / read once: {a / b:.2f}x")
PYEOF
