// Benchmark: the coordinator's share of a save at scale. Builds synthetic local plans for R
// ranks x T tensors (each tensor row-sharded over all ranks, plus one replicated byte item per
// rank), then times global planning (de-duplication, Metadata, validation), building
// storage_data from the write results, metadata serialization and parsing, and reports the
// '.metadata' size. It also times the decoding of the ranks' plans (what dcp::save's
// coordinator receives) and enable_plan_caching: the first save, and a repeated one in which no
// rank's plan changed (every rank sends an empty "unchanged" plan). It times writing the
// '.metadata' file as the commit does, streamed from the encoder through O_DIRECT and fsynced,
// against the same through the page cache; and the coordinator's other steps in dcp::save,
// outside the total: encoding the final plans, decoding the write results, and
// encoding the committed Metadata for its broadcast.
//
//   coordinator_bench [ranks=1024] [tensors=2000] [dir]
//   coordinator_bench read <dir>
//   coordinator_bench read-steps <dir>
//   coordinator_bench read-tree <dir>
//
// With a directory, the '.metadata' is left there as '<dir>/.metadata' (without one, it goes
// to a temporary directory and is removed). The second form then times, in a fresh process,
// FileSystemReader::read_metadata on it: what every rank runs at the start of a load; the third
// splits that time into reading the file and the direct decoder's pass (what read_metadata
// runs), times the object-tree decoder it falls back to (the tree alone, then tree and
// Metadata), times the wire message the coordinator broadcasts instead of the pickle, and
// measures the floor under them all: the first touch of 1 GiB of fresh memory, in 4 KiB pages
// and in transparent huge pages, against touching it again; the fourth times read_metadata's
// work with the object-tree decoder instead of the direct one, in a fresh process (what a
// file the direct decoder gives up on costs).
// bench/python_read_metadata.py <dir> times Python DCP's.
//
// Each step also reports how much it grew the peak resident memory: at this scale, touching
// fresh memory (page faults) costs more than the work itself, above all on a VM.
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "format/metadata_codec.h"
#include "format/pickle.h"
#include "io/file.h"
#include "protocol/plan_codec.h"
#include "storage/metadata_file.h"
#include "storage_data.h"
#include "util/crc32.h"

namespace {

// Wall time and peak-memory growth of one step.
class Step {
 public:
  Step() : t0_(std::chrono::steady_clock::now()), peak0_kib_(peak_kib()) {}
  void stop() {
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    grew_mib = static_cast<double>(peak_kib() - peak0_kib_) / 1024.0;
  }
  double seconds = 0, grew_mib = 0;

 private:
  static long peak_kib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;
  }
  std::chrono::steady_clock::time_point t0_;
  long peak0_kib_;
};

}  // namespace

int read_metadata(const std::string& dir) {
  Step read;
  const dcp::Metadata metadata = dcp::FileSystemReader(dir).read_metadata();
  read.stop();
  std::printf("  dcp FileSystemReader::read_metadata: %.3f s, peak memory +%.0f MiB (%zu storage "
              "entries)\n",
              read.seconds, read.grew_mib, metadata.storage_data.size());
  return 0;
}

// What read_metadata costs when the direct decoder gives up (a '.metadata' it does not know):
// the same file read, then the object-tree decoder; in a fresh process, as `read`.
int read_tree(const std::string& dir) {
  Step read;
  const std::string bytes = dcp::detail::read_file(dir + "/.metadata");
  const dcp::Metadata metadata =
      dcp::detail::decode_metadata_tree(bytes.data(), bytes.size(), "bench");
  read.stop();
  std::printf("  read_file + decode_metadata_tree (the fallback): %.3f s, peak memory +%.0f MiB "
              "(%zu storage entries)\n",
              read.seconds, read.grew_mib, metadata.storage_data.size());
  return 0;
}

// Where read_metadata's time goes, in a fresh process: reading the file (as read_metadata
// does), the direct decoder (what read_metadata runs), and the decoder it falls back to: the
// pickle's object tree alone (then dropped), then the tree again and the Metadata.
int read_steps(const std::string& dir) {
  Step file;
  const std::string bytes = dcp::detail::read_file(dir + "/.metadata");
  file.stop();
  // The direct decoder first, while the process's memory is fresh, as in read_metadata.
  Step direct;
  std::optional<dcp::Metadata> direct_metadata =
      dcp::detail::decode_metadata_direct(bytes.data(), bytes.size());
  direct.stop();
  Step tree_step;
  {
    const dcp::detail::pickle::Tree tree =
        dcp::detail::pickle::unpickle_view(bytes.data(), bytes.size(), "bench");
    tree_step.stop();
  }
  Step build;
  const dcp::Metadata metadata =
      dcp::detail::decode_metadata_tree(bytes.data(), bytes.size(), "bench");
  build.stop();
  std::printf("  reading the file: %.3f s, +%.0f MiB\n", file.seconds, file.grew_mib);
  std::printf("  decode_metadata_direct (what read_metadata runs): %.3f s, +%.0f MiB (%s)\n",
              direct.seconds, direct.grew_mib,
              !direct_metadata                ? "gave up"
              : *direct_metadata == metadata ? "the same Metadata as the tree's"
                                              : "A DIFFERENT Metadata from the tree's");
  direct_metadata.reset();
  std::printf("  the pickle's object tree alone: %.3f s, +%.0f MiB\n", tree_step.seconds,
              tree_step.grew_mib);
  std::printf("  decode_metadata_tree (tree again, then Metadata): %.3f s, +%.0f MiB (%zu "
              "storage entries)\n",
              build.seconds, build.grew_mib, metadata.storage_data.size());
  // What the other ranks decode instead in dcp::load and dcp::save: the coordinator's
  // broadcast of the same Metadata, in the wire format (protocol/plan_codec.h).
  Step encode;
  const std::string message = dcp::detail::encode_metadata_message(metadata);
  encode.stop();
  Step decode;
  const dcp::Metadata broadcast = dcp::detail::decode_metadata_message(message);
  decode.stop();
  std::printf("  encode_metadata_message: %.3f s (%zu bytes); decode_metadata_message: %.3f s, "
              "+%.0f MiB\n",
              encode.seconds, message.size(), decode.seconds, decode.grew_mib);
  // The floor under all of it: what the first touch of fresh memory costs on this machine,
  // against touching the same memory again, and against fresh memory in transparent huge
  // pages (one fault per 2 MiB instead of per 4 KiB; when the kernel allows them on request).
  constexpr size_t kGiB = size_t{1} << 30;
  auto touch = [&](bool huge) {
    void* p = mmap(nullptr, kGiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return std::make_pair(-1.0, -1.0);
    if (huge) madvise(p, kGiB, MADV_HUGEPAGE);
    Step first;
    std::memset(p, 1, kGiB);
    first.stop();
    Step again;
    std::memset(p, 2, kGiB);
    again.stop();
    munmap(p, kGiB);
    return std::make_pair(first.seconds, again.seconds);
  };
  const auto small_pages = touch(false);
  const auto huge_pages = touch(true);
  std::printf("  touching 1 GiB of fresh memory (memset): %.3f s (again: %.3f s; fresh, "
              "MADV_HUGEPAGE: %.3f s)\n",
              small_pages.first, small_pages.second, huge_pages.first);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "read") return read_metadata(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "read-steps") return read_steps(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "read-tree") return read_tree(argv[2]);
  const int ranks = argc > 1 ? std::stoi(argv[1]) : 1024;
  const int tensors = argc > 2 ? std::stoi(argv[2]) : 2000;
  const int64_t rows = 4096, cols = 1024;

  // Every rank's local plan, as the coordinator receives them.
  auto make_plans = [&] {
    std::vector<dcp::SavePlan> plans(ranks);
    for (int r = 0; r < ranks; ++r) {
      auto box = dcp::compute_local_box({rows, cols}, {ranks}, {r}, {dcp::Placement::Shard(0)});
      auto& plan = plans[r];
      plan.items.reserve(tensors + 1);
      for (int t = 0; t < tensors; ++t) {
        dcp::WriteItem item;
        item.type = dcp::WriteItemType::SHARD;
        const std::string fqn =
            "model.layers." + std::to_string(t / 8) + ".w" + std::to_string(t % 8);
        item.index = dcp::MetadataIndex(fqn, box.offsets);
        dcp::TensorProperties props;
        props.dtype = c10::ScalarType::BFloat16;
        item.tensor_data = dcp::TensorWriteData{
            {dcp::Dims(box.offsets), dcp::Dims(box.sizes)}, props, {rows, cols}};
        plan.items.push_back(std::move(item));
        plan.planner_data.emplace(fqn, dcp::ObjectPath{dcp::Key(fqn)});
      }
      dcp::WriteItem step;
      step.index = dcp::MetadataIndex("step");
      plan.items.push_back(step);
      plan.planner_data.emplace("step", dcp::ObjectPath{dcp::Key("step")});
    }
    return plans;
  };
  Step build;
  std::vector<dcp::SavePlan> plans = make_plans();
  build.stop();

  // What the coordinator of dcp::save receives: every rank's plan, encoded. It plans on the
  // plans it decoded, as dcp::save does (the ranks' own plans are freed first).
  std::vector<std::string> encoded;
  for (const auto& p : plans) encoded.push_back(dcp::detail::encode_save_plan(p));
  plans = {};
  Step decode_plans;
  std::vector<dcp::SavePlan> decoded = dcp::detail::decode_save_plans(encoded);
  decode_plans.stop();
  encoded = {};

  dcp::DefaultSavePlanner planner;
  Step plan;
  auto [final_plans, metadata] = planner.create_global_plan(std::move(decoded));
  plan.stop();
  // The final plans go back to the ranks (dcp::save's scatter).
  Step scatter;
  const size_t scattered_bytes = [&] {
    size_t n = 0;
    for (const std::string& e : dcp::detail::encode_save_plans(final_plans)) n += e.size();
    return n;
  }();
  scatter.stop();

  // enable_plan_caching (Python's): a first save fills the cache; a repeated save in which no
  // rank's plan changed gets an empty "unchanged" plan from every rank (nothing to decode) and
  // reuses the global plan and Metadata.
  dcp::DefaultSavePlannerOptions caching_options;
  caching_options.enable_plan_caching = true;
  dcp::DefaultSavePlanner caching(caching_options);
  std::vector<dcp::SavePlan> again = make_plans();
  Step first_cached;
  caching.create_global_plan(std::move(again));
  first_cached.stop();
  std::vector<dcp::SavePlan> unchanged(ranks);
  for (auto& p : unchanged) p.usable = false;
  Step repeat;
  auto [deltas, cached_metadata] = caching.create_global_plan(std::move(unchanged));
  repeat.stop();
  const bool cache_hit = caching.plan_cache_stats().global_plan_hits == 1 &&
                         cached_metadata == metadata;

  // What the writers' results add: one storage entry per item. Each rank's results are
  // encoded as its write step sends them; the coordinator decodes them (timed) and collects
  // the entries, as dcp::save does.
  std::vector<std::string> encoded_results;
  for (int r = 0; r < ranks; ++r) {
    std::vector<dcp::WriteResult> mine;
    int64_t offset = 0;
    const std::string file = "__" + std::to_string(r) + "_0.distcp";
    for (const auto& item : final_plans[r].items) {
      mine.push_back({item.index, item.tensor_storage_size(), {file, offset, 4096, {}}});
      offset += 4096;
    }
    encoded_results.push_back(dcp::detail::encode_write_results(mine));
  }
  std::vector<std::vector<dcp::WriteResult>> all_results;
  Step gather;
  for (const auto& e : encoded_results) {
    all_results.push_back(dcp::detail::decode_write_results(e));
  }
  gather.stop();
  encoded_results = {};
  std::vector<std::pair<dcp::MetadataIndex, dcp::StorageInfo>> results;
  for (const auto& rank_results : all_results) {
    for (const auto& r : rank_results) results.emplace_back(r.index, r.storage_data);
  }
  all_results = {};  // as before the storage step: only the entries are live
  Step storage;
  metadata.storage_data = dcp::detail::make_storage_data(std::move(results));
  metadata.version = dcp::kDcpVersion;
  storage.stop();

  Step encode;
  const std::string bytes = dcp::detail::encode_metadata(metadata);
  encode.stop();
  Step decode;
  const dcp::Metadata back = dcp::detail::decode_metadata(bytes.data(), bytes.size(), "bench");
  decode.stop();
  const bool same = back == metadata;

  // The commit's part: '.metadata' on disk, fsynced, with its size and CRC-32 (for the
  // checksum sidecar), encoded straight into the file (detail::write_metadata_file). Before:
  // written through the page cache, then fsynced (the flush of 223 MiB of dirty pages). Now,
  // as FileSystemWriter's commit does by default: through O_DIRECT, the disk writing one 8 MiB
  // buffer while the encoder fills the next. Both files stay until the end, so that neither
  // reuses the other's pages; `DCP_BENCH_DIRECT_FIRST=1` times the O_DIRECT one first.
  std::string dir;
  if (argc > 3) {
    dir = argv[3];
    dcp::detail::create_directories(dir);  // as a save would
  } else {
    char temp[] = "/tmp/coordinator_bench.XXXXXX";
    if (mkdtemp(temp) == nullptr) return 1;
    dir = temp;
  }
  const std::string buffered_path = dir + "/.metadata.buffered";
  const uint32_t whole_crc = dcp::detail::crc32(bytes.data(), bytes.size());
  Step buffered;
  Step stream;
  // Writes the file, fsynced; true when it holds the encoded bytes (same size and CRC-32).
  auto write = [&](const std::string& path, bool direct_io, Step& step) {
    step = Step();
    const dcp::detail::MetadataChecksum written =
        dcp::detail::write_metadata_file(path, metadata, {/*sync=*/true, direct_io});
    step.stop();
    return written.size == bytes.size() && written.crc32 == whole_crc;
  };
  const char* direct_first = std::getenv("DCP_BENCH_DIRECT_FIRST");
  bool same_file = true;
  if (direct_first != nullptr && std::string(direct_first) == "1") {
    same_file &= write(dir + "/.metadata", /*direct_io=*/true, stream);
    same_file &= write(buffered_path, /*direct_io=*/false, buffered);
  } else {
    same_file &= write(buffered_path, /*direct_io=*/false, buffered);
    same_file &= write(dir + "/.metadata", /*direct_io=*/true, stream);
  }
  // After the commit, dcp::save broadcasts the committed Metadata to every rank.
  Step message;
  const size_t message_bytes = dcp::detail::encode_metadata_message(metadata).size();
  message.stop();
  dcp::detail::remove_file(buffered_path);
  if (argc <= 3) {
    dcp::detail::remove_file(dir + "/.metadata");
    dcp::detail::remove_directory(dir);
  }

  std::printf("coordinator at %d ranks x %d tensors (%zu write items)\n", ranks, tensors,
              metadata.storage_data.size());
  auto row = [](const char* what, const Step& step) {
    std::printf("  %-55s %7.3f s, peak memory +%5.0f MiB\n", what, step.seconds, step.grew_mib);
  };
  row("building the local plans (not the coordinator's work):", build);
  row("decoding the ranks' plans (dcp::save's coordinator):", decode_plans);
  row("global plan (dedup + metadata + validation):", plan);
  row("encoding the final plans (scatter, not in the total):", scatter);
  row("global plan, enable_plan_caching, first save (+ cache):", first_cached);
  row("global plan, enable_plan_caching, repeated save (hit):", repeat);
  row("decoding the ranks' write results (not in the total):", gather);
  row("storage_data from the write results:", storage);
  row("metadata serialization into memory:", encode);
  row("'.metadata' streamed, buffered + fsync (before):", buffered);
  row("'.metadata' streamed, O_DIRECT + fsync (now):", stream);
  row("metadata parsing:", decode);
  row("Metadata broadcast after the commit (not in the total):", message);
  std::printf("  round trip equal: %s; same file size and CRC-32 both ways: %s; .metadata size: "
              "%.1f MiB\n",
              same ? "yes" : "NO", same_file ? "yes" : "NO", bytes.size() / 1048576.0);
  std::printf("  '.metadata' on disk, fsynced: %.3f s buffered (before), %.3f s O_DIRECT (now)\n",
              buffered.seconds, stream.seconds);
  const double rest = storage.seconds + stream.seconds;
  std::printf("  coordinator total (plan decode + plan + storage_data + '.metadata' written): "
              "%.3f s\n",
              decode_plans.seconds + plan.seconds + rest);
  std::printf("  every step of dcp::save's coordinator (the total, the final plans (%.0f MiB), "
              "the write results, the broadcast (%.0f MiB)): %.3f s\n",
              scattered_bytes / 1048576.0, message_bytes / 1048576.0,
              decode_plans.seconds + plan.seconds + rest + scatter.seconds + gather.seconds +
                  message.seconds);
  std::printf("  the same, repeated save with enable_plan_caching (no plan to decode): %.3f s "
              "(%.1fx less; cache hit with the same Metadata: %s)\n",
              repeat.seconds + rest,
              (decode_plans.seconds + plan.seconds + rest) / (repeat.seconds + rest),
              cache_hit ? "yes" : "NO");
  return same && same_file && cache_hit ? 0 : 1;
}
