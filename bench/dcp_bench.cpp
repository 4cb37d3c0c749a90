// dcp's side of the benchmark harness (bench/run_bench.sh), under mpirun:
//   dcp_bench save <dir> <MiB>   every rank saves its shards of the benchmark state
//   dcp_bench load <dir> <MiB>   every rank loads its shards for this world size (the same as
//                                the save's, or another: a resharding load)
// An optional 4th argument sets the IO threads per rank (FileSystemWriter/Reader thread_count);
// a 5th, for A/B runs, turns off one fast path: "buffered" O_DIRECT writes
// (FileSystemWriterOptions::direct_io), "noprefetch" read hints
// (FileSystemReaderOptions::prefetch_bytes = 0), "nocrc" CRC-32 checks on load
// (FileSystemReaderOptions::verify_crc32 = false); and "zstd" saves compressed items
// (Compression::kZstd; loads need no flag).
// Before a load every rank evicts the checkpoint's files from the page cache
// (posix_fadvise DONTNEED), so reads come from the disk. Rank 0 prints one line:
//   RESULT op=<save|load> ranks=N bytes=B seconds=S read_bytes=R peak_rss_overhead_mib=M
// where R is the sum over ranks of bytes read through read(2)/pread(2) (/proc/self/io rchar),
// and M the largest per-rank growth of peak RSS during the operation beyond the state itself.
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "bench/bench_state.h"
#include "dcp/dcp.h"

namespace {

int64_t proc_io(const char* field) {
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == std::string(field) + ":") return value;
  }
  return 0;
}

int64_t current_rss_kib() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int64_t peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void evict(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  at::set_num_threads(1);
  int rc = 0;
  {
    dcp::MpiCommunicator comm(MPI_COMM_WORLD);
    const std::string op = argv[1], dir = argv[2];
    const int64_t mib = std::stoll(argv[3]);
    const int threads = argc > 4 ? std::stoi(argv[4]) : 1;  // IO threads per rank
    const std::string off = argc > 5 ? argv[5] : "";
    if (!off.empty() && off != "buffered" && off != "noprefetch" && off != "nocrc" &&
        off != "zstd") {
      std::fprintf(stderr, "dcp_bench: unknown 5th argument '%s'\n", off.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const auto specs = dcp::bench::model_specs(mib);
    int64_t bytes = 0;
    dcp::StateDict state = dcp::bench::make_state(specs, comm.rank(), comm.size(), op == "load", &bytes);
    if (op == "load" && comm.rank() == 0) evict(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    // The state is built; what grows from here is the library's overhead. ru_maxrss cannot be
    // reset, so the overhead is counted as the peak above max(current RSS, earlier peak).
    const int64_t base_kib = std::max(current_rss_kib(), peak_rss_kib());
    const int64_t rchar0 = proc_io("rchar");
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (op == "save") {
        dcp::SaveOptions o;
        o.comm = &comm;
        dcp::FileSystemWriterOptions wo;
        wo.thread_count = threads;
        wo.direct_io = off != "buffered";
        if (off == "zstd") wo.compression = dcp::Compression::kZstd;
        dcp::FileSystemWriter writer(dir, wo);
        dcp::save(state, writer, o);
      } else {
        dcp::LoadOptions o;
        o.comm = &comm;
        dcp::FileSystemReaderOptions ro;
        ro.thread_count = threads;
        if (off == "noprefetch") ro.prefetch_bytes = 0;
        if (off == "nocrc") ro.verify_crc32 = false;
        dcp::FileSystemReader reader(dir, ro);
        dcp::load(state, reader, o);
      }
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what_without_backtrace());
      rc = 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t mine[3] = {bytes, proc_io("rchar") - rchar0,
                       std::max<int64_t>(0, peak_rss_kib() - base_kib)};
    int64_t sums[2] = {0, 0}, max_overhead = 0;
    MPI_Reduce(mine, sums, 2, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mine[2], &max_overhead, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
    if (comm.rank() == 0) {
      std::printf("RESULT op=%s ranks=%d bytes=%lld seconds=%.4f read_bytes=%lld peak_rss_overhead_mib=%.1f\n",
                  op.c_str(), comm.size(), static_cast<long long>(sums[0]), seconds,
                  static_cast<long long>(sums[1]), max_overhead / 1024.0);
    }
  }
  MPI_Finalize();
  return rc;
}
