// The raw-disk baseline of bench/run_bench.sh: writes and reads back the same byte count with
// O_DIRECT, sequentially, one file per thread (one thread per rank of the dcp run), 8 MiB
// aligned blocks; the write includes the final fsync. Falls back to buffered IO plus fsync (and
// page-cache eviction before reading) where the file system refuses O_DIRECT, and says so.
//   raw_disk_bench <dir> <total_bytes> <threads>
// Prints: RESULT op=raw_write|raw_read bytes=B seconds=S direct=0|1
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: raw_disk_bench <dir> <total_bytes> <threads>\n");
    return 2;
  }
  const std::string dir = argv[1];
  const long long total = std::atoll(argv[2]);
  const int threads = std::atoi(argv[3]);
  constexpr size_t kBlock = 8 << 20;
  const long long per = (total / threads + kBlock - 1) / kBlock * kBlock;
  bool direct = true;
  {
    const std::string probe = dir + "/raw_probe";
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) direct = false;
    else ::close(fd);
    ::unlink(probe.c_str());
  }
  auto run = [&](bool write) {
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const std::string path = dir + "/raw_" + std::to_string(t);
        int flags = (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | (direct ? O_DIRECT : 0);
        int fd = ::open(path.c_str(), flags, 0644);
        if (fd < 0) { std::perror("open"); std::exit(1); }
        if (!write && !direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        void* buf = nullptr;
        if (posix_memalign(&buf, 4096, kBlock) != 0) std::exit(1);
        std::memset(buf, t + 1, kBlock);
        for (long long off = 0; off < per; off += kBlock) {
          const ssize_t n = write ? ::pwrite(fd, buf, kBlock, off) : ::pread(fd, buf, kBlock, off);
          if (n != static_cast<ssize_t>(kBlock)) { std::perror("io"); std::exit(1); }
        }
        if (write) ::fsync(fd);
        if (write && !direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
        std::free(buf);
      });
    }
    for (auto& th : pool) th.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double w = run(true);
  const double r = run(false);
  std::printf("RESULT op=raw_write bytes=%lld seconds=%.4f direct=%d\n", per * threads, w, direct);
  std::printf("RESULT op=raw_read bytes=%lld seconds=%.4f direct=%d\n", per * threads, r, direct);
  for (int t = 0; t < threads; ++t) ::unlink((dir + "/raw_" + std::to_string(t)).c_str());
  return 0;
}
