// The raw-disk baseline of bench/run_bench.sh: writes and reads back the same byte count with
// O_DIRECT, sequentially, one file per thread (one thread per rank of the dcp run), 8 MiB
// aligned blocks; the write includes the final fsync. Falls back to buffered IO plus fsync (and
// page-cache eviction before reading) where the file system refuses O_DIRECT, and says so.
// The read runs twice: one request at a time per file (raw_read, what `dd iflag=direct` does),
// then, after the files were rewritten cold (below), 8 requests in flight per file
// (raw_read_deep: 8 threads per file taking every 8th block), what a reader that keeps the
// disk busy can reach.
//   raw_disk_bench <dir> <total_bytes> <threads>
// Prints: RESULT op=raw_write|raw_read|raw_read_deep bytes=B seconds=S direct=0|1
//
//   raw_disk_bench cold <file>...
// Rewrites each file in place with O_DIRECT (copied to "<file>.cold", fsynced, renamed over
// the file), so that before a timed load every checkpoint's bytes were last written the same
// way, whichever library wrote them. On a VM whose host caches what the guest writes through
// its page cache but not what it writes with O_DIRECT, this takes both libraries' files out of
// every cache (the guest's page cache never holds them: reads and writes are O_DIRECT).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

void die(const char* what, const std::string& path) {
  std::fprintf(stderr, "raw_disk_bench: %s '%s': %s\n", what, path.c_str(), std::strerror(errno));
  std::exit(1);
}

// One file rewritten as described at the top. Falls back to buffered IO plus fsync where
// O_DIRECT is refused.
void rewrite_cold(const std::string& path, void* buf, size_t block) {
  const std::string tmp = path + ".cold";
  bool direct = true;
  int in = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (in < 0) { direct = false; in = ::open(path.c_str(), O_RDONLY); }
  if (in < 0) die("open", path);
  int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (out < 0) die("open", tmp);
  off_t size = 0;
  while (true) {
    const ssize_t n = ::pread(in, buf, block, size);
    if (n < 0) die("read", path);
    if (n == 0) break;
    const size_t padded = direct ? (static_cast<size_t>(n) + 4095) / 4096 * 4096 : n;
    if (::pwrite(out, buf, padded, size) != static_cast<ssize_t>(padded)) die("write", tmp);
    size += n;
    if (static_cast<size_t>(n) < block) break;
  }
  if (::ftruncate(out, size) != 0 || ::fsync(out) != 0) die("sync", tmp);
  if (!direct) ::posix_fadvise(out, 0, 0, POSIX_FADV_DONTNEED);
  ::close(in);
  ::close(out);
  if (::rename(tmp.c_str(), path.c_str()) != 0) die("rename", tmp);
}

}  // namespace

int main(int argc, char** argv) {
  constexpr size_t kBlock = 8 << 20;
  if (argc >= 2 && std::string(argv[1]) == "cold") {
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, kBlock) != 0) std::exit(1);
    for (int i = 2; i < argc; ++i) rewrite_cold(argv[i], buf, kBlock);
    std::free(buf);
    return 0;
  }
  if (argc != 4) {
    std::fprintf(stderr,
                 "usage: raw_disk_bench <dir> <total_bytes> <threads>\n"
                 "       raw_disk_bench cold <file>...\n");
    return 2;
  }
  const std::string dir = argv[1];
  const long long total = std::atoll(argv[2]);
  const int threads = std::atoi(argv[3]);
  const long long per = (total / threads + kBlock - 1) / kBlock * kBlock;
  bool direct = true;
  {
    const std::string probe = dir + "/raw_probe";
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) direct = false;
    else ::close(fd);
    ::unlink(probe.c_str());
  }
  auto run = [&](bool write, int depth) {  // depth: threads per file, each every depth-th block
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int w = 0; w < threads * depth; ++w) {
      pool.emplace_back([&, t = w / depth, first = w % depth] {
        const std::string path = dir + "/raw_" + std::to_string(t);
        int flags = (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | (direct ? O_DIRECT : 0);
        int fd = ::open(path.c_str(), flags, 0644);
        if (fd < 0) { std::perror("open"); std::exit(1); }
        if (!write && !direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        void* buf = nullptr;
        if (posix_memalign(&buf, 4096, kBlock) != 0) std::exit(1);
        std::memset(buf, t + 1, kBlock);
        for (long long off = first * static_cast<long long>(kBlock); off < per;
             off += depth * static_cast<long long>(kBlock)) {
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
  const double w = run(true, 1);
  const double r = run(false, 1);
  {
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, kBlock) != 0) std::exit(1);
    for (int t = 0; t < threads; ++t) rewrite_cold(dir + "/raw_" + std::to_string(t), buf, kBlock);
    std::free(buf);
  }
  const double deep = run(false, 8);
  std::printf("RESULT op=raw_write bytes=%lld seconds=%.4f direct=%d\n", per * threads, w, direct);
  std::printf("RESULT op=raw_read bytes=%lld seconds=%.4f direct=%d\n", per * threads, r, direct);
  std::printf("RESULT op=raw_read_deep bytes=%lld seconds=%.4f direct=%d\n", per * threads, deep,
              direct);
  for (int t = 0; t < threads; ++t) ::unlink((dir + "/raw_" + std::to_string(t)).c_str());
  return 0;
}
