// Benchmark: the torch.save container's cost per byte on the save path. Writes one tensor of
// <MiB> as a torch.save archive to a sink that drops the bytes, `rounds` times each way, taking
// turns: dcp's writer (write_tensor_archive: ZipWriter, CRC-32 by ISA-L) and LibTorch's
// PyTorchStreamWriter given the same records (what dcp used before: miniz computes the
// CRC-32). Prints each one's median time and GB/s, and the ratio, from the same run.
//
//   archive_bench [MiB=256] [rounds=5]
//
// The cost per record (issue #17, part 4): `count` small float tensors (256 B to 16 KiB, the
// chunks a 4-rank save of bench_state.h's "small" state writes), each as its own archive into a
// sink that copies the bytes round an 8 MiB buffer, as DirectFileOutput copies them into its
// staging buffers. Prints the median time per record, and against it a plain memcpy of the same
// tensor bytes (the floor).
//
//   archive_bench records [count=20000] [rounds=5]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "format/torch_save.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int records(int count, int rounds) {
  std::vector<at::Tensor> tensors;
  uint64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    tensors.push_back(at::rand({64 * (1 + i % 64)}, at::kFloat));
    bytes += tensors.back().nbytes();
  }
  std::vector<char> buffer(size_t{8} << 20);
  size_t at = 0;
  const auto copy = [&](const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t k = std::min(n, buffer.size() - at);
      if (p != nullptr) std::memcpy(buffer.data() + at, p, k);
      at = (at + k) % buffer.size();
      p = p ? p + k : nullptr;
      n -= k;
    }
  };
  std::vector<double> ours, floor;
  uint64_t written = 0;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    written = 0;
    for (const at::Tensor& t : tensors) written += dcp::detail::write_tensor_archive(t, copy);
    ours.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    for (const at::Tensor& t : tensors) copy(t.data_ptr(), t.nbytes());
    floor.push_back(seconds_since(t0));
  }
  const double a = median(ours), b = median(floor);
  std::printf("%d small tensors (%.1f MiB), each a torch.save archive (%.1f MiB in all), into an "
              "8 MiB buffer, median of %d:\n",
              count, bytes / 1048576.0, written / 1048576.0, rounds);
  std::printf("  dcp's archives:                %.4f s, %.2f us per record\n", a, a / count * 1e6);
  std::printf("  memcpy of the tensor bytes:    %.4f s, %.2f us per record\n", b, b / count * 1e6);
  std::printf("  per record beyond the memcpy:  %.2f us\n", (a - b) / count * 1e6);
  return 0;
}

int main(int argc, char** argv) {
  at::set_num_threads(1);
  if (argc > 1 && std::string(argv[1]) == "records") {
    const int count = argc > 2 ? std::stoi(argv[2]) : 20000;
    const int rounds = argc > 3 ? std::stoi(argv[3]) : 5;
    if (count <= 0 || rounds <= 0) {
      std::fprintf(stderr, "usage: archive_bench records [count=20000] [rounds=5]\n");
      return 2;
    }
    return records(count, rounds);
  }
  const int64_t mib = argc > 1 ? std::stoll(argv[1]) : 256;
  const int rounds = argc > 2 ? std::stoi(argv[2]) : 5;
  if (mib <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: archive_bench [MiB=256] [rounds=5]\n");
    return 2;
  }
  const at::Tensor t = at::rand({mib << 18}, at::kFloat);
  const uint64_t bytes = t.nbytes();
  std::string data_pkl;  // the archive's own data.pkl, for LibTorch's writer
  std::vector<double> ours, libtorch;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    dcp::detail::write_tensor_archive(t, [](const void*, size_t) {});
    ours.push_back(seconds_since(t0));

    t0 = std::chrono::steady_clock::now();
    caffe2::serialize::PyTorchStreamWriter writer([](const void*, size_t n) { return n; });
    writer.writeRecord("data.pkl", "\x80\x02N.", 4);
    writer.writeRecord(".format_version", "1", 1);
    writer.writeRecord(".storage_alignment", "64", 2);
    writer.writeRecord("byteorder", "little", 6);
    writer.writeRecord("data/0", t.data_ptr(), bytes);
    writer.writeEndOfFile();
    libtorch.push_back(seconds_since(t0));
  }
  const double a = median(ours), b = median(libtorch);
  std::printf("a torch.save archive of %lld MiB to a null sink, median of %d:\n",
              static_cast<long long>(mib), rounds);
  std::printf("  dcp (ZipWriter, ISA-L CRC-32):         %.4f s, %6.2f GB/s\n", a, bytes / a / 1e9);
  std::printf("  LibTorch PyTorchStreamWriter (miniz): %.4f s, %6.2f GB/s\n", b, bytes / b / 1e9);
  std::printf("  LibTorch / dcp: %.1fx\n", b / a);
  return 0;
}
