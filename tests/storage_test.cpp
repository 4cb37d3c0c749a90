// Storage tests: the conformance suite (testing/storage_conformance.h) run against the file
// system (fast and simple paths) and the in-memory storage; the read order and read hints of
// the file-system reader; the O_DIRECT and buffered output streams; the rank-local metadata
// merge and the streamed write of '.metadata'.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "dcp/dcp.h"
#include "format/metadata_codec.h"
#include "io/fault_injection.h"
#include "io/file.h"
#include "storage/file_output.h"
#include "storage/metadata_file.h"
#include "storage/read_items.h"
#include "storage/write_items.h"
#include "util/crc32.h"
#include "testing/storage_conformance.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using testing::StorageBackendFactory;
using testing::StorageConformanceTest;

class FileSystemBackend : public testing::StorageBackend {
 public:
  // fast_paths false forces the simple paths: buffered writes, whole-record reads, no read
  // hints.
  explicit FileSystemBackend(bool fast_paths = true) : fast_paths_(fast_paths) {}
  std::unique_ptr<StorageWriter> writer(const std::string& id, int threads,
                                        bool single_file_per_rank) override {
    FileSystemWriterOptions o;
    o.thread_count = threads;
    o.single_file_per_rank = single_file_per_rank;
    o.direct_io = fast_paths_;
    return std::make_unique<FileSystemWriter>(dir_.sub(id), o);
  }
  std::unique_ptr<StorageReader> reader(const std::string& id) override {
    FileSystemReaderOptions o;
    o.ranged_reads = fast_paths_;
    if (!fast_paths_) o.prefetch_bytes = 0;
    return std::make_unique<FileSystemReader>(dir_.sub(id), o);
  }
  std::vector<std::string> files(const std::string& id) override {
    if (!detail::is_directory(dir_.sub(id))) return {};
    // The files of the format; '.metadata.checksum' is this backend's own (the checksum tests
    // cover it).
    auto names = detail::list_directory(dir_.sub(id));
    names.erase(std::remove(names.begin(), names.end(), ".metadata.checksum"), names.end());
    std::sort(names.begin(), names.end());
    return names;
  }
  void truncate(const std::string& id, const std::string& name, size_t n) override {
    std::filesystem::resize_file(dir_.sub(id) + "/" + name, n);
  }
  size_t file_size(const std::string& id, const std::string& name) override {
    return std::filesystem::file_size(dir_.sub(id) + "/" + name);
  }

 private:
  bool fast_paths_;
  testing::TempDir dir_;
};

class MemoryBackend : public testing::StorageBackend {
 public:
  std::unique_ptr<StorageWriter> writer(const std::string& id, int threads,
                                        bool single_file_per_rank) override {
    MemoryWriterOptions o;
    o.thread_count = threads;
    o.single_file_per_rank = single_file_per_rank;
    return std::make_unique<MemoryWriter>(storage_, id, o);
  }
  std::unique_ptr<StorageReader> reader(const std::string& id) override {
    return std::make_unique<MemoryReader>(storage_, id);
  }
  std::vector<std::string> files(const std::string& id) override { return storage_.list(id); }
  void truncate(const std::string& id, const std::string& name, size_t n) override {
    auto bytes = storage_.get(id, name);
    ASSERT_TRUE(bytes.has_value());
    storage_.put(id, name, (*bytes)->substr(0, n));
  }
  size_t file_size(const std::string& id, const std::string& name) override {
    return (*storage_.get(id, name))->size();
  }

 private:
  MemoryStorage storage_;
};

// An in-memory data file that logs reads and prefetch hints, in the order made, into one log
// shared by all files.
struct IoEvent {
  bool prefetch;
  std::string file;
  uint64_t begin, end;
};
class LoggingFile : public detail::InputFile {
 public:
  LoggingFile(std::string name, std::string bytes, std::vector<IoEvent>* log)
      : name_(std::move(name)), bytes_(std::move(bytes)), log_(log) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, void* dst, size_t n) const override {
    ASSERT_LE(offset + n, bytes_.size());
    std::memcpy(dst, bytes_.data() + offset, n);
    log_->push_back({false, name_, offset, offset + n});
  }
  void prefetch(uint64_t offset, uint64_t n) const override {
    log_->push_back({true, name_, offset, offset + n});
  }

 private:
  std::string name_, bytes_;
  std::vector<IoEvent>* log_;
};

TEST(ReadOrderTest, EachFileIsReadFrontToBack) {
  // Files hold tensors largest first, so key order ("a" < "b" < ...) would jump backwards.
  StateDict sd;
  const std::vector<std::pair<std::string, int64_t>> specs{
      {"a", 300}, {"b", 5000}, {"c", 1200}, {"d", 4000}, {"e", 2500}, {"f", 700}};
  for (size_t k = 0; k < specs.size(); ++k) {
    sd[specs[k].first] = testing::make_tensor(at::kFloat, {specs[k].second}, int64_t(k));
  }
  testing::TempDir dir;
  FileSystemWriterOptions wo;
  wo.thread_count = 2;
  FileSystemWriter writer(dir.sub("ckpt"), wo);
  save(sd, writer);
  FileSystemReader reader(dir.sub("ckpt"));
  const Metadata md = reader.read_metadata();

  StateDict out = testing::blank_like(sd);
  DefaultLoadPlanner planner;
  planner.set_up_planner(out, md, true);
  const LoadPlan plan = planner.create_local_plan();
  std::vector<IoEvent> log;
  detail::ReadOptions ranged;
  ranged.whole_record_bytes = 0;  // the tensor data is read on its own (Note [Small records])
  detail::read_items(
      plan, planner, md,
      [&](const std::string& name) {
        return std::make_shared<LoggingFile>(name, detail::read_file(dir.sub("ckpt/" + name)),
                                             &log);
      },
      ranged);
  EXPECT_TRUE(testing::describe_difference(Value(sd), Value(out)).empty());

  // The tensor data reads of each file (reads of a whole tensor's bytes), in the order made.
  std::set<size_t> tensor_bytes;
  for (const auto& [name, numel] : specs) tensor_bytes.insert(static_cast<size_t>(numel) * 4);
  std::map<std::string, std::vector<uint64_t>> data_reads;
  for (const IoEvent& e : log) {
    if (!e.prefetch && tensor_bytes.count(e.end - e.begin)) data_reads[e.file].push_back(e.begin);
  }
  ASSERT_EQ(data_reads.size(), 2u);
  for (const auto& [name, offsets] : data_reads) {
    EXPECT_EQ(offsets.size(), 3u) << name;
    EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end())) << name;
  }
  // And key order would not have been file order.
  std::map<std::string, std::vector<int64_t>> by_key;
  for (const auto& [index, info] : md.storage_data) by_key[info.relative_path].push_back(info.offset);
  EXPECT_TRUE(std::any_of(by_key.begin(), by_key.end(), [](const auto& file) {
    return !std::is_sorted(file.second.begin(), file.second.end());
  }));
}

// Loads checkpoint `dir` into `out` through read_items with the given prefetch window, and
// returns the log of reads and hints. By default, records are read by ranges and only touching
// hints merge, whatever their size (whole_record_bytes and prefetch_merge_gap 0).
std::vector<IoEvent> load_logged(const std::string& dir, StateDict& out, uint64_t prefetch,
                                 uint64_t whole_record_bytes = 0,
                                 uint64_t prefetch_merge_gap = 0) {
  FileSystemReader reader(dir);
  const Metadata md = reader.read_metadata();
  DefaultLoadPlanner planner;
  planner.set_up_planner(out, md, true);
  const LoadPlan plan = planner.create_local_plan();
  std::vector<IoEvent> log;
  detail::ReadOptions options;
  options.prefetch_bytes = prefetch;
  options.whole_record_bytes = whole_record_bytes;
  options.prefetch_merge_gap = prefetch_merge_gap;
  detail::read_items(
      plan, planner, md,
      [&](const std::string& name) {
        return std::make_shared<LoggingFile>(name, detail::read_file(dir + "/" + name),
                                                     &log);
      },
      options);
  return log;
}

// Note [Prefetch]: every byte read was announced before it was read, the hints cover little
// more than what is read (here a resharding load reads a quarter of each saved chunk), and the
// window bounds how far ahead the hints run.
TEST(PrefetchTest, HintsCoverEveryReadBeforeItAndLittleElse) {
  StateDict saved;
  for (int k = 0; k < 6; ++k) {
    saved["w" + std::to_string(k)] = testing::make_tensor(at::kFloat, {64, 256}, k);  // 64 KiB
  }
  saved["step"] = Value(int64_t{7});
  testing::TempDir dir;
  save(saved, *std::make_unique<FileSystemWriter>(dir.sub("ckpt")));

  // Rank 1 of 4 in a row-sharded layout: rows [16, 32) of every tensor.
  StateDict out;
  for (int k = 0; k < 6; ++k) {
    out["w" + std::to_string(k)] =
        zeros_sharded({64, 256}, at::kFloat, {4}, 1, {Placement::Shard(0)});
  }
  out["step"] = Value(int64_t{0});
  const std::vector<IoEvent> log = load_logged(dir.sub("ckpt"), out, 1 << 30);
  for (int k = 0; k < 6; ++k) {
    const at::Tensor expected = saved["w" + std::to_string(k)].tensor().narrow(0, 16, 16);
    EXPECT_TRUE(at::equal(out["w" + std::to_string(k)].get<ShardedTensor>().local_shards()[0].tensor,
                          expected));
  }
  EXPECT_EQ(out["step"].get<int64_t>(), 7);

  uint64_t hinted = 0, read = 0;
  std::vector<IoEvent> hints;
  for (const IoEvent& e : log) {
    if (e.prefetch) {
      hints.push_back(e);
      hinted += e.end - e.begin;
      continue;
    }
    read += e.end - e.begin;
    const bool covered = std::any_of(hints.begin(), hints.end(), [&](const IoEvent& h) {
      return h.file == e.file && h.begin <= e.begin && e.end <= h.end;
    });
    EXPECT_TRUE(covered) << "read of " << e.file << " [" << e.begin << ", " << e.end
                         << ") was not announced before it";
  }
  // 6 x 16 KiB of tensor data are needed out of 6 x 64 KiB saved. The hints add each record's
  // headers and the last 4 KiB the zip reader reads, and a few KiB of slack.
  EXPECT_GE(hinted, 6u * 16384);
  EXPECT_LE(hinted, 6u * 16384 + 7u * 8192) << "hinted " << hinted << " bytes, read " << read;
  EXPECT_LE(hinted, read + 7u * 4096) << "hinted " << hinted << " bytes, read " << read;
  // With a 1 GiB window every hint comes before the first read.
  const auto first_read = std::find_if(log.begin(), log.end(), [](const IoEvent& e) {
    return !e.prefetch;
  });
  EXPECT_TRUE(std::none_of(first_read, log.end(), [](const IoEvent& e) { return e.prefetch; }));

  // With a 1-byte window each record is announced just before it is read: hints and reads
  // alternate record by record.
  StateDict again = testing::blank_like(saved);
  const std::vector<IoEvent> tight = load_logged(dir.sub("ckpt"), again, 1);
  EXPECT_TRUE(testing::describe_difference(Value(saved), Value(again)).empty());
  int switches = 0;
  for (size_t i = 1; i < tight.size(); ++i) switches += tight[i].prefetch != tight[i - 1].prefetch;
  EXPECT_GE(switches, 2 * 7 - 1);  // 7 records: hint, reads, hint, reads, ...

  // And 0 turns the hints off.
  StateDict none = testing::blank_like(saved);
  const std::vector<IoEvent> off = load_logged(dir.sub("ckpt"), none, 0);
  EXPECT_TRUE(std::none_of(off.begin(), off.end(), [](const IoEvent& e) { return e.prefetch; }));
  EXPECT_TRUE(testing::describe_difference(Value(saved), Value(none)).empty());
}

// Note [Small records] and Note [Prefetch]: with the default options, a model of many small
// tensors is read with one read per record, and the announcements of records that follow each
// other in a file merge into a few large hints, each sent before the first read it covers.
TEST(PrefetchTest, SmallRecordsAreOneReadEachAndTheirHintsMerge) {
  StateDict saved;
  for (int k = 0; k < 40; ++k) {
    saved["norm" + std::to_string(k)] = testing::make_tensor(at::kFloat, {256 + 16 * k}, k);
  }
  saved["step"] = Value(int64_t{7});
  testing::TempDir dir;
  save(saved, *std::make_unique<FileSystemWriter>(dir.sub("ckpt")));
  const size_t records = 41;

  StateDict out = testing::blank_like(saved);
  const std::vector<IoEvent> log = load_logged(dir.sub("ckpt"), out, 1 << 30, detail::kWholeRecordBytes,
                                               detail::kPrefetchMergeGap);
  EXPECT_TRUE(testing::describe_difference(Value(saved), Value(out)).empty());
  std::vector<IoEvent> hints;
  size_t reads = 0;
  for (const IoEvent& e : log) {
    if (e.prefetch) {
      hints.push_back(e);
      continue;
    }
    ++reads;
    EXPECT_TRUE(std::any_of(hints.begin(), hints.end(), [&](const IoEvent& h) {
      return h.file == e.file && h.begin <= e.begin && e.end <= h.end;
    })) << "read of " << e.file << " [" << e.begin << ", " << e.end << ") was not announced";
  }
  EXPECT_EQ(reads, records);
  EXPECT_LE(hints.size(), 2u);  // one data file (one per rank and thread), under 2 MiB in all

  // Read by ranges, each record takes several reads and hints.
  StateDict ranged = testing::blank_like(saved);
  const std::vector<IoEvent> by_ranges = load_logged(dir.sub("ckpt"), ranged, 1 << 30);
  EXPECT_TRUE(testing::describe_difference(Value(saved), Value(ranged)).empty());
  const size_t ranged_reads = std::count_if(by_ranges.begin(), by_ranges.end(),
                                            [](const IoEvent& e) { return !e.prefetch; });
  EXPECT_GE(ranged_reads, 3 * (records - 1));
}

// Odd-sized writes, from a few bytes to more than the staging buffer, land in the file in
// order, through O_DIRECT where the file system allows it (and buffered writes elsewhere).
TEST(FileOutputTest, DirectAndBufferedStreamsWriteExactlyTheBytesGiven) {
  testing::TempDir dir;
  std::string expected;
  std::vector<size_t> sizes = {1, 30, 4096, 4095, detail::DirectFileOutput::kBufferSize + 7,
                               100, 3 * detail::DirectFileOutput::kBufferSize, 4097, 5};
  for (size_t n : sizes) {
    for (size_t k = 0; k < n; ++k) expected.push_back(static_cast<char>((expected.size() * 131) >> 3));
  }
  for (bool direct : {true, false}) {
    const std::string path = dir.sub(direct ? "direct" : "buffered");
    const int flags = O_WRONLY | O_CREAT | O_TRUNC;
    std::optional<detail::File> file;
    if (direct) file = detail::File::open_direct(path, flags);
    const bool opened_direct = file.has_value();
    if (!file) file = detail::File::open(path, flags);
    size_t at = 0;
    auto feed = [&](detail::OutputStream& out) {
      for (size_t n : sizes) {
        out.write(expected.data() + at, n);
        at += n;
        EXPECT_EQ(out.position(), at);
      }
    };
    if (opened_direct) {
      detail::DirectFileOutput out(*file);
      feed(out);
      out.finish();
      EXPECT_FALSE(out.fell_back());
    } else {
      detail::BufferedFileOutput out(*file);
      feed(out);
      out.finish();
    }
    file->close();
    EXPECT_TRUE(detail::read_file(path) == expected) << path;
  }
}

// Counts file writes (from any thread); the write numbered `fail_at` (from 1) fails with
// ENOSPC, none with 0.
struct FailNthWrite : detail::FaultInjector {
  explicit FailNthWrite(int fail_at) : fail_at(fail_at) {}
  int before(detail::FileOp op, const std::string&) override {
    return op == detail::FileOp::kWrite && ++writes == fail_at ? ENOSPC : 0;
  }
  const int fail_at;
  std::atomic<int> writes{0};
};

// Note [Write queue]: full buffers are written in the background, in file order, while the next
// fills. A write that fails there (ENOSPC on any of more buffers than the queue holds) is
// reported by a later write() or by finish(), never lost, and no buffer after it is written;
// a stream destroyed with writes in flight waits for them.
TEST(FileOutputTest, ABackgroundWriteFailureIsReportedAndNothingRunsAfterTheStream) {
  testing::TempDir dir;
  const size_t buffer = detail::DirectFileOutput::kBufferSize;
  const int buffers = static_cast<int>(detail::DirectFileOutput::kBuffers) + 3;
  const std::string bytes(buffers * buffer + 100, 'x');
  for (int failing : {1, 2, buffers - 3, buffers}) {
    SCOPED_TRACE(failing);
    const std::string path = dir.sub("f" + std::to_string(failing));
    std::optional<detail::File> file =
        detail::File::open_direct(path, O_WRONLY | O_CREAT | O_TRUNC);
    ASSERT_TRUE(file.has_value()) << "the test directory refuses O_DIRECT";
    FailNthWrite injector(failing);
    detail::FaultInjector* previous = detail::set_fault_injector(&injector);
    std::string error;
    try {
      detail::DirectFileOutput out(*file);
      out.write(bytes.data(), bytes.size());  // hands over every full buffer
      out.finish();
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
    detail::set_fault_injector(previous);
    EXPECT_NE(error.find(path), std::string::npos) << error;
    EXPECT_NE(error.find(std::strerror(ENOSPC)), std::string::npos) << error;
    EXPECT_EQ(injector.writes, failing);  // nothing written after the failed buffer
    EXPECT_EQ(std::filesystem::file_size(path), (failing - 1) * buffer);
  }
  // Destroyed without finish() while writes are in flight: waits for them, throws nothing.
  const std::string path = dir.sub("abandoned");
  std::optional<detail::File> file = detail::File::open_direct(path, O_WRONLY | O_CREAT | O_TRUNC);
  ASSERT_TRUE(file.has_value());
  {
    detail::DirectFileOutput out(*file);
    out.write(bytes.data(), bytes.size());
  }
  file->close();
  EXPECT_GE(std::filesystem::file_size(path), buffers * buffer);
}

// Holds every file write until released.
struct HoldWrites : detail::FaultInjector {
  int before(detail::FileOp op, const std::string&) override {
    if (op != detail::FileOp::kWrite) return 0;
    std::unique_lock<std::mutex> lock(mu);
    ++started;
    changed.notify_all();
    changed.wait(lock, [&] { return released; });
    return 0;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    changed.notify_all();
  }
  std::mutex mu;
  std::condition_variable changed;
  int started = 0;
  bool released = false;
};

// Note [Write queue]: while the disk is busy with one buffer, write() goes on filling the others:
// kBuffers - 1 full buffers are queued without a wait, one write at a time reaches the disk, and
// the file gets every byte in order once the disk takes them.
TEST(FileOutputTest, FullBuffersQueueBehindASlowWriteInFileOrder) {
  testing::TempDir dir;
  const size_t buffer = detail::DirectFileOutput::kBufferSize;
  const size_t queued = detail::DirectFileOutput::kBuffers - 1;
  std::string bytes(queued * buffer + 100, '\0');
  for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<char>((k * 131) >> 12);
  const std::string path = dir.sub("queued");
  std::optional<detail::File> file = detail::File::open_direct(path, O_WRONLY | O_CREAT | O_TRUNC);
  ASSERT_TRUE(file.has_value()) << "the test directory refuses O_DIRECT";
  HoldWrites hold;
  detail::FaultInjector* previous = detail::set_fault_injector(&hold);
  {
    detail::DirectFileOutput out(*file);
    auto filling = std::async(std::launch::async, [&] {
      for (size_t at = 0; at < bytes.size(); at += 4096) {
        out.write(bytes.data() + at, std::min<size_t>(4096, bytes.size() - at));
      }
    });
    const bool returned = filling.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    {
      std::unique_lock<std::mutex> lock(hold.mu);
      hold.changed.wait_for(lock, std::chrono::seconds(30), [&] { return hold.started > 0; });
      EXPECT_EQ(hold.started, 1);  // one write at a time, the others queued behind it
    }
    hold.release();
    filling.get();
    EXPECT_TRUE(returned) << "write() waited for the disk with buffers free";
    out.finish();
  }
  detail::set_fault_injector(previous);
  file->close();
  EXPECT_TRUE(detail::read_file(path) == bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, StorageConformanceTest,
    ::testing::Values(
        std::make_pair("FileSystem", StorageBackendFactory([] { return std::make_unique<FileSystemBackend>(); })),
        std::make_pair("FileSystemSimplePath",
                       StorageBackendFactory([] { return std::make_unique<FileSystemBackend>(false); })),
        std::make_pair("Memory", StorageBackendFactory([] { return std::make_unique<MemoryBackend>(); }))),
    [](const auto& info) { return std::string(info.param.first); });

}  // namespace
}  // namespace dcp

// ---------------------------------------------------------------------------------------------
// Rank-local metadata (Note [Rank-local metadata]): the merge of a save without collectives.

namespace dcp {
namespace {

Metadata rank_part(int rank, c10::ScalarType dtype, std::vector<int64_t> rows) {
  Metadata md;
  TensorStorageMetadata t;
  t.properties.dtype = dtype;
  t.size = {4, 3};
  t.chunks.push_back(ChunkStorageMetadata{{rows[0], 0}, {rows[1], 3}});
  md.state_dict_metadata["w"] = t;
  md.state_dict_metadata["step"] = BytesStorageMetadata{};
  const std::string prefix = "__" + std::to_string(rank) + "_0.distcp";
  md.storage_data[MetadataIndex("w", std::vector<int64_t>{rows[0], 0})] = StorageInfo{prefix, 0, 10, {}};
  md.storage_data[MetadataIndex("step")] = StorageInfo{prefix, 10, 5, {}};
  return md;
}

TEST(RankLocalMetadataTest, MergeUnitesChunksAndKeepsTheLowestRanksCopies) {
  const Metadata merged = detail::merge_rank_local_metadata(
      {{"__0.metadata", rank_part(0, at::kFloat, {0, 2})},
       {"__1.metadata", rank_part(1, at::kFloat, {2, 2})}});
  const auto& w = std::get<TensorStorageMetadata>(merged.state_dict_metadata.at("w"));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1].offsets, (Dims{2, 0}));
  EXPECT_EQ(merged.storage_data.at(MetadataIndex("w", std::vector<int64_t>{2, 0})).relative_path, "__1_0.distcp");
  EXPECT_EQ(merged.storage_data.at(MetadataIndex("step")).relative_path, "__0_0.distcp");
}

TEST(RankLocalMetadataTest, ContradictionsNameTheKeyAndBothFiles) {
  auto error = [](const Metadata& a, const Metadata& b) {
    try {
      detail::merge_rank_local_metadata({{"__0.metadata", a}, {"__1.metadata", b}});
    } catch (const c10::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = error(rank_part(0, at::kFloat, {0, 2}), rank_part(1, at::kDouble, {2, 2}));
  EXPECT_NE(e.find("'__1.metadata' describes 'w' as float64 [4, 3] but '__0.metadata' as "
                   "float32 [4, 3]"),
            std::string::npos)
      << e;
  e = error(rank_part(0, at::kFloat, {0, 2}), rank_part(1, at::kFloat, {0, 3}));
  EXPECT_NE(e.find("has a chunk of 'w' at [0, 0] of sizes [3, 3] where '__0.metadata' has "
                   "sizes [2, 3]"),
            std::string::npos)
      << e;
  Metadata bytes_w = rank_part(1, at::kFloat, {2, 2});
  bytes_w.state_dict_metadata["w"] = BytesStorageMetadata{};
  e = error(rank_part(0, at::kFloat, {0, 2}), bytes_w);
  EXPECT_NE(e.find("stores 'w' as bytes but '__0.metadata' as a tensor"), std::string::npos) << e;
}

// The commit's '.metadata' is encoded straight into its file, in pieces, buffered or through
// O_DIRECT (where the file system allows it): the file holds the encoder's bytes, the size and
// CRC-32 reported for the checksum sidecar are those of the file, with the save id the
// metadata declares, and a write that fails at any point (the O_DIRECT path's first write runs
// on its background thread) throws naming the file and leaves nothing there.
TEST(MetadataFileTest, WriteStreamsTheEncodingAndReportsItsSizeAndCrc) {
  Metadata md;
  TensorStorageMetadata t;
  t.properties.dtype = at::kFloat;
  constexpr int64_t kRows = 250000;
  t.size = {kRows, 8};
  for (int64_t row = 0; row < kRows; ++row) {
    t.chunks.push_back(ChunkStorageMetadata{{row, 0}, {1, 8}});
    md.storage_data.append(MetadataIndex("layers.weight", std::vector<int64_t>{row, 0}),
                           StorageInfo{"__0_0.distcp", row * 32, 32, {}});
  }
  md.state_dict_metadata["layers.weight"] = t;
  md.storage_meta = StorageMeta{};
  md.storage_meta->save_id = "save-7";
  const std::string expected = detail::encode_metadata(md);
  // Several 1 MiB pieces, and more than two O_DIRECT staging buffers.
  ASSERT_GT(expected.size(), 2 * detail::DirectFileOutput::kBufferSize);

  testing::TempDir dir;
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    const detail::MetadataWriteOptions options{/*sync=*/true, /*direct_io=*/direct};
    const std::string path = dir.sub(direct ? "direct.tmp" : "buffered.tmp");
    FailNthWrite counter(/*fail_at=*/0);
    detail::FaultInjector* previous = detail::set_fault_injector(&counter);
    const detail::MetadataChecksum written = detail::write_metadata_file(path, md, options);
    detail::set_fault_injector(previous);
    EXPECT_EQ(written.size, expected.size());
    EXPECT_EQ(written.crc32, detail::crc32(expected.data(), expected.size()));
    EXPECT_EQ(written.save_id, "save-7");
    EXPECT_TRUE(detail::read_file(path) == expected);
    const int writes = counter.writes;
    ASSERT_GE(writes, 3);  // 8 MiB buffers, or 1 MiB pieces

    for (int failing : {1, 2, writes}) {
      SCOPED_TRACE(failing);
      const std::string failed = dir.sub("failed" + std::to_string(failing));
      FailNthWrite injector(failing);
      previous = detail::set_fault_injector(&injector);
      std::string error;
      try {
        detail::write_metadata_file(failed, md, options);
      } catch (const c10::Error& e) {
        error = e.what_without_backtrace();
      }
      detail::set_fault_injector(previous);
      EXPECT_NE(error.find(failed), std::string::npos) << error;
      EXPECT_NE(error.find(std::strerror(ENOSPC)), std::string::npos) << error;
      EXPECT_FALSE(std::filesystem::exists(failed));
    }
  }
}

}  // namespace
}  // namespace dcp
