"""The tables of bench/run_bench.sh, from the RESULT lines it logged (one per run):

    bench_report.py single <log> <rounds> <state> <ranks> <reshard_ranks>
    bench_report.py sweep <log> <rounds> <state>

Each case's time is the median of its rounds (the mean of the middle two for an even count);
throughputs are bytes / median time, and every ratio compares runs of the same log.
"""
import statistics
import sys


def parse(path):
    runs = {}  # (case, ranks) -> [RESULT fields]
    for line in open(path):
        kv = dict(p.split("=", 1) for p in line.split()[1:])
        case = kv["case"] + ("_" + kv["op"] if kv["case"] == "raw" else "")
        runs.setdefault((case, int(kv["ranks"])), []).append(kv)
    return runs


def median_run(rs):  # a middle run, with the median time
    ordered = sorted(rs, key=lambda r: float(r["seconds"]))
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["seconds"] = str(statistics.median(float(r["seconds"]) for r in rs))
    return row


def gbps(r):
    return float(r["bytes"]) / float(r["seconds"]) / 1e9


def single(runs, rounds, state, n, m):
    rows = {k: median_run(v) for k, v in runs.items()}
    print(f"\nstate '{state}', median of {rounds} rounds per case (fastest - slowest run in brackets)")
    print(f"{'case':<28}{'wall s':>9}{'(min - max)':>16}{'GB/s':>8}{'peak RSS +MiB/rank':>20}{'read/needed':>13}")
    cases = [("python_save", n, f"Python DCP save ({n})"), ("dcp_save", n, f"dcp save ({n})"),
             ("python_load", n, f"Python DCP load ({n})"), ("dcp_load", n, f"dcp load ({n})"),
             ("python_reshard", m, f"Python DCP load ({n}->{m})"),
             ("dcp_reshard", m, f"dcp load ({n}->{m})"),
             ("raw_raw_write", n, "raw O_DIRECT write"), ("raw_raw_read", n, "raw O_DIRECT read"),
             ("raw_raw_read_deep", n, "raw read, 8 in flight")]
    for case, ranks, label in cases:
        r = rows.get((case, ranks))
        if not r:
            continue
        times = [float(x["seconds"]) for x in runs[(case, ranks)]]
        spread = f"({min(times):.2f} - {max(times):.2f})"
        ratio = (f"{float(r['read_bytes'])/float(r['bytes']):.2f}x"
                 if "read_bytes" in r and r["op"] == "load" else "")
        rss = max((x.get("peak_rss_overhead_mib", "") for x in runs[(case, ranks)]),
                  key=lambda v: float(v or 0))
        print(f"{label:<28}{float(r['seconds']):>9.2f}{spread:>16}{gbps(r):>8.2f}{rss:>20}{ratio:>13}")
    print()
    for op, py, ours, ranks, raw in [("save", "python_save", "dcp_save", n, "raw_raw_write"),
                                     ("load", "python_load", "dcp_load", n, "raw_raw_read"),
                                     ("reshard load", "python_reshard", "dcp_reshard", m, "raw_raw_read")]:
        if (py, ranks) in rows and (ours, ranks) in rows:
            ours_gbps = gbps(rows[(ours, ranks)])
            line = f"{op:<14} dcp / Python throughput: {ours_gbps / gbps(rows[(py, ranks)]):.2f}x"
            if (raw, n) in rows:
                line += f"   dcp / raw disk: {ours_gbps / gbps(rows[(raw, n)]):.2f}"
            if op != "save" and ("raw_raw_read_deep", n) in rows:
                line += f" ({ours_gbps / gbps(rows[('raw_raw_read_deep', n)]):.2f} against 8 in flight)"
            print(line)


def sweep(runs, rounds, state):
    rows = {k: median_run(v) for k, v in runs.items()}
    ranks = sorted({r for (_, r) in rows})
    print(f"\nstate '{state}', median of {rounds} rounds per case; times in seconds,"
          " ratios of throughput (higher is better for dcp)")
    head = (f"{'ranks':>5} | {'Python save':>11}{'dcp save':>10}{'dcp/Py':>8}{'dcp/raw':>9} | "
            f"{'Python load':>11}{'dcp load':>10}{'dcp/Py':>8}{'dcp/raw':>9}{'read/need':>10}")
    print(head)
    print("-" * len(head))
    for n in ranks:
        def t(case):
            r = rows.get((case, n))
            return float(r["seconds"]) if r else float("nan")
        ps, ds, rw = t("python_save"), t("dcp_save"), t("raw_raw_write")
        pl, dl, rr = t("python_load"), t("dcp_load"), t("raw_raw_read")
        load = rows.get(("dcp_load", n))
        # dcp's and Python's byte counts are the state's; the raw run's is dcp's checkpoint.
        raw_w = gbps(rows[("raw_raw_write", n)]) if ("raw_raw_write", n) in rows else float("nan")
        raw_r = gbps(rows[("raw_raw_read", n)]) if ("raw_raw_read", n) in rows else float("nan")
        dsave = gbps(rows[("dcp_save", n)]) if ("dcp_save", n) in rows else float("nan")
        dload = gbps(load) if load else float("nan")
        need = f"{float(load['read_bytes']) / float(load['bytes']):.2f}x" if load else ""
        print(f"{n:>5} | {ps:>11.2f}{ds:>10.2f}{ps / ds:>7.2f}x{dsave / raw_w:>9.2f} | "
              f"{pl:>11.2f}{dl:>10.2f}{pl / dl:>7.2f}x{dload / raw_r:>9.2f}{need:>10}")


def main():
    mode, log, rounds, state = sys.argv[1:5]
    runs = parse(log)
    if mode == "sweep":
        sweep(runs, rounds, state)
    else:
        single(runs, rounds, state, int(sys.argv[5]), int(sys.argv[6]))
    if any(r.get("direct") == "0" for (case, _), rs in runs.items() if case == "raw_raw_write"
           for r in rs):
        print("(the file system refused O_DIRECT: the raw baseline is buffered IO + fsync)")


if __name__ == "__main__":
    main()
