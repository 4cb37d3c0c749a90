"""Python DCP's side of the coordinator benchmark: times FileSystemReader.read_metadata, what
every Python DCP rank runs at the start of a load, on a '.metadata' that
build/bench/coordinator_bench wrote to <dir>.

    python python_read_metadata.py <dir>

Prints the seconds and how much the read grew the process's peak RSS."""
import resource
import sys
import time

from torch.distributed.checkpoint import FileSystemReader


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    path = sys.argv[1]
    reader = FileSystemReader(path)
    before = peak_rss_mib()
    t0 = time.perf_counter()
    metadata = reader.read_metadata()
    seconds = time.perf_counter() - t0
    print(f"  Python DCP FileSystemReader.read_metadata: {seconds:.3f} s, "
          f"peak memory +{peak_rss_mib() - before:.0f} MiB "
          f"({len(metadata.storage_data)} storage entries)")


if __name__ == "__main__":
    main()
