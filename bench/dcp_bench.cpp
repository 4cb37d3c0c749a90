// dcp's side of the benchmark harness (bench/run_bench.sh), under mpirun:
//   dcp_bench save <dir> <MiB>   every rank saves its shards of the benchmark state
//   dcp_bench load <dir> <MiB>   every rank loads its shards for this world size (the same as
//                                the save's, or another: a resharding load)
// An optional 4th argument sets the IO threads per rank (FileSystemWriter/Reader thread_count);
// a 5th is a comma-separated list of flags. For A/B runs, each turns off one fast path:
// "buffered" O_DIRECT writes (FileSystemWriterOptions::direct_io), "noprefetch" read hints
// (FileSystemReaderOptions::prefetch_bytes = 0), "nocrc" CRC-32 checks on load
// (FileSystemReaderOptions::verify_crc32 = false), "noshare" read-once broadcasts
// (LoadOptions::read_once = false). "zstd" saves compressed items (Compression::kZstd; loads
// need no flag); "replicated" makes every tensor whole on every rank (a DDP state) instead of
// row shards (use it for the save and the load); "small" uses the state of 20,000 small tensors
// (bench_state.h; MiB is then ignored; use it for the save and the load).
// Before a load every rank evicts the checkpoint's files from the page cache
// (posix_fadvise DONTNEED), so reads come from the disk. Rank 0 prints one line:
//   RESULT op=<save|load> ranks=N bytes=B seconds=S read_bytes=R peak_rss_overhead_mib=M
//          checkpoint_bytes=C
// where R is the sum over ranks of bytes read through read(2)/pread(2) (/proc/self/io rchar),
// M the largest per-rank growth of peak RSS during the operation beyond the state itself, and
// C the size of the checkpoint's files.
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
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
  if (argc < 4 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "load")) {
    std::fprintf(stderr, "usage: dcp_bench <save|load> <dir> <MiB> [threads] [flag,...]\n");
    MPI_Finalize();
    return 2;
  }
  int rc = 0;
  {
    dcp::MpiCommunicator comm(MPI_COMM_WORLD);
    const std::string op = argv[1], dir = argv[2];
    const int64_t mib = std::stoll(argv[3]);
    const int threads = argc > 4 ? std::stoi(argv[4]) : 1;  // IO threads per rank
    std::set<std::string> flags;
    if (argc > 5) {
      std::stringstream list(argv[5]);
      for (std::string f; std::getline(list, f, ',');) {
        if (f != "buffered" && f != "noprefetch" && f != "nocrc" && f != "zstd" &&
            f != "replicated" && f != "noshare" && f != "small") {
          std::fprintf(stderr, "dcp_bench: unknown flag '%s'\n", f.c_str());
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
        flags.insert(f);
      }
    }
    auto flag = [&](const char* f) { return flags.count(f) != 0; };
    const bool small = flag("small");
    const auto specs = dcp::bench::state_specs(small ? "small" : "model", mib);
    int64_t bytes = 0;
    dcp::StateDict state = dcp::bench::make_state(specs, comm.rank(), comm.size(), op == "load",
                                                  &bytes, flag("replicated"), /*adam=*/!small);
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
        wo.direct_io = !flag("buffered");
        if (flag("zstd")) wo.compression = dcp::Compression::kZstd;
        dcp::FileSystemWriter writer(dir, wo);
        dcp::save(state, writer, o);
      } else {
        dcp::LoadOptions o;
        o.comm = &comm;
        o.read_once = !flag("noshare");
        dcp::FileSystemReaderOptions ro;
        ro.thread_count = threads;
        if (flag("noprefetch")) ro.prefetch_bytes = 0;
        if (flag("nocrc")) ro.verify_crc32 = false;
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
      int64_t files_bytes = 0;  // what the checkpoint holds on disk
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.is_regular_file()) files_bytes += static_cast<int64_t>(e.file_size());
      }
      std::printf("RESULT op=%s ranks=%d bytes=%lld seconds=%.4f read_bytes=%lld peak_rss_overhead_mib=%.1f checkpoint_bytes=%lld\n",
                  op.c_str(), comm.size(), static_cast<long long>(sums[0]), seconds,
                  static_cast<long long>(sums[1]), max_overhead / 1024.0,
                  static_cast<long long>(files_bytes));
    }
  }
  MPI_Finalize();
  return rc;
}
