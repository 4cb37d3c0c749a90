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
//   dcp_bench protocol <plans MiB> <metadata MiB>
//                                what dcp::save's two steps through the communicator cost at
//                                scale (DistWrapper over MPI), with payloads of a large save's
//                                sizes and no planning or IO: the plan step (every rank sends
//                                its plan, the coordinator returns each rank's final plan:
//                                <plans MiB> each way in all) and the write step (every rank
//                                sends its results, <plans MiB> / 4 in all; every rank gets the
//                                committed Metadata's message, <metadata MiB>). Rank 0, the
//                                coordinator, prints RESULT op=protocol with each step's best
//                                time of 3 (from entering the step until it returns on rank 0).
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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "bench/bench_state.h"
#include "dcp/dcp.h"
#include "protocol/dist_wrapper.h"

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int protocol(int64_t plans_mib, int64_t metadata_mib) {
  dcp::MpiCommunicator comm(MPI_COMM_WORLD);
  dcp::detail::DistWrapper dist(comm, /*coordinator=*/0);
  const size_t ranks = static_cast<size_t>(comm.size());
  const size_t plan_bytes = static_cast<size_t>(plans_mib << 20) / ranks;
  const size_t metadata_bytes = static_cast<size_t>(metadata_mib << 20);
  double plan_step = 1e9, write_step = 1e9;
  for (int round = 0; round < 3; ++round) {
    // The payloads exist before each step, as the encoded plans do in dcp::save.
    std::string plan(plan_bytes, 'p');
    std::vector<std::string> finals(dist.is_coordinator() ? ranks : 0,
                                    std::string(plan_bytes, 'f'));
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    const std::string mine = dist.reduce_scatter(
        "plan", [&] { return std::move(plan); },
        [&](std::vector<std::string> all) {
          TORCH_CHECK(all.size() == ranks && all.back().size() == plan_bytes);
          return std::move(finals);
        });
    plan_step = std::min(plan_step, seconds_since(t0));
    TORCH_CHECK(mine.size() == plan_bytes);
    std::string results(plan_bytes / 4, 'r');
    std::string committed(dist.is_coordinator() ? metadata_bytes : 0, 'm');
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = std::chrono::steady_clock::now();
    const std::string metadata = dist.all_reduce(
        "write", [&] { return std::move(results); },
        [&](std::vector<std::string> all) {
          TORCH_CHECK(all.size() == ranks);
          return std::move(committed);
        });
    write_step = std::min(write_step, seconds_since(t0));
    TORCH_CHECK(metadata.size() == metadata_bytes);
  }
  if (comm.rank() == 0) {
    std::printf("RESULT op=protocol ranks=%zu plans_mib=%lld metadata_mib=%lld plan_step=%.4f "
                "write_step=%.4f\n",
                ranks, static_cast<long long>(plans_mib), static_cast<long long>(metadata_mib),
                plan_step, write_step);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  at::set_num_threads(1);
  if (argc == 4 && std::string(argv[1]) == "protocol") {
    int rc = 1;
    try {
      rc = protocol(std::stoll(argv[2]), std::stoll(argv[3]));
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "%s\n", e.what_without_backtrace());
    }
    MPI_Finalize();
    return rc;
  }
  if (argc < 4 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "load")) {
    std::fprintf(stderr, "usage: dcp_bench <save|load> <dir> <MiB> [threads] [flag,...]\n"
                         "       dcp_bench protocol <plans MiB> <metadata MiB>\n");
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
