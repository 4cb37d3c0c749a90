// Python DCP's optional formats, in dcp: compressed items (Python's ZStandard extension,
// "stream.zstd/1"): FileSystemWriter with Compression::kZstd round trips bitwise (resharding
// included), verify checks compressed records, and hostile compressed items (corrupt,
// truncated, decompressing past what their metadata allows, an unknown transform) are clear
// errors; and saves without collectives (one "__{rank}.metadata" per rank). The Python side is
// in tests/interop (test_interop.py, test_interop_distributed.py).
#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <string>

#include "dcp/dcp.h"
#include "format/metadata_codec.h"
#include "io/file.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using testing::TempDir;

void save_zstd(const StateDict& state, const std::string& dir, Communicator* comm = nullptr) {
  FileSystemWriterOptions options;
  options.compression = Compression::kZstd;
  FileSystemWriter writer(dir, options);
  SaveOptions save_options;
  save_options.comm = comm;
  save(state, writer, save_options);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "no error";
}

void rewrite_metadata(const std::string& checkpoint, const Metadata& md) {
  const std::string bytes = detail::encode_metadata(md);
  detail::File f = detail::File::open(checkpoint + "/.metadata", O_WRONLY | O_TRUNC);
  f.write_all(bytes.data(), bytes.size());
  detail::remove_file(checkpoint + "/.metadata.checksum");
}

TEST(CompressionTest, ZstdRoundTripIsBitwiseAndEveryItemNamesTheTransform) {
  TempDir dir;
  const StateDict reference = testing::reference_state_dict();
  save_zstd(reference, dir.path());
  const Metadata md = FileSystemReader(dir.path()).read_metadata();
  for (const auto& [index, info] : md.storage_data) {
    EXPECT_EQ(info.transform_descriptors, std::vector<std::string>{"stream.zstd/1"}) << index.fqn;
  }
  StateDict loaded = testing::blank_like(reference);
  load(loaded, dir.path());
  const std::string diff = testing::describe_difference(Value(reference), Value(loaded));
  EXPECT_TRUE(diff.empty()) << diff;
  const VerifyReport report = verify(dir.path());
  EXPECT_TRUE(report.problems.empty()) << report.problems.front().message;
}

TEST(CompressionTest, CompressedCheckpointsReshard) {
  TempDir dir;
  const at::Tensor full = testing::make_tensor(at::kFloat, {9, 6}, 4);
  run_in_process(3, [&](Communicator& comm) {
    save_zstd(StateDict{{"w", distribute_tensor(full, {3}, comm.rank(), {Placement::Shard(0)})}},
              dir.path(), &comm);
  });
  run_in_process(2, [&](Communicator& comm) {
    StateDict state{{"w", zeros_sharded({9, 6}, at::kFloat, {2}, comm.rank(),
                                        {Placement::Shard(1)})}};
    LoadOptions options;
    options.comm = &comm;
    load(state, dir.path(), options);
    const Shard& shard = state.at("w").get<ShardedTensor>().local_shards().at(0);
    EXPECT_TRUE(torch::equal(shard.tensor, full.narrow(1, shard.offsets[1], 3)));
  });
}

TEST(CompressionTest, CompressibleDataShrinks) {
  TempDir dir;
  save_zstd(StateDict{{"zeros", torch::zeros({1 << 18})}}, dir.sub("z"));  // 1 MiB
  save(StateDict{{"zeros", torch::zeros({1 << 18})}}, dir.sub("plain"));
  auto data_bytes = [](const std::string& d) {
    uintmax_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      if (e.path().extension() == ".distcp") n += e.file_size();
    }
    return n;
  };
  EXPECT_LT(data_bytes(dir.sub("z")) * 100, data_bytes(dir.sub("plain")));
}

TEST(CompressionTest, HostileCompressedItemsAreClearErrors) {
  TempDir dir;
  const std::string c = dir.sub("c");
  save_zstd(StateDict{{"zeros", torch::zeros({1 << 18})}}, c);
  const Metadata original = FileSystemReader(c).read_metadata();
  auto& [index, info] = *original.storage_data.begin();
  auto load_error = [&] {
    StateDict state{{"zeros", torch::ones({1 << 18})}};
    return error_of([&] { load(state, c); });
  };
  {  // an unknown transform
    Metadata md = original;
    md.storage_data.begin()->second.transform_descriptors = {"stream.lz4/1"};
    rewrite_metadata(c, md);
    const std::string e = load_error();
    EXPECT_NE(e.find("'stream.lz4/1', which dcp does not read"), std::string::npos) << e;
  }
  {  // a truncated stream: the item's length cut short
    Metadata md = original;
    md.storage_data.begin()->second.length -= 5;
    rewrite_metadata(c, md);
    const std::string e = load_error();
    EXPECT_NE(e.find("zstd"), std::string::npos) << e;
    EXPECT_NE(e.find(info.relative_path), std::string::npos) << e;
  }
  {  // a bomb: 1 MiB of zeros whose metadata claims 16 elements
    Metadata md = original;
    auto& tensor = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("zeros"));
    tensor.size = {16};
    tensor.chunks.at(0).sizes = {16};
    rewrite_metadata(c, md);
    StateDict state{{"zeros", torch::ones({16})}};
    const std::string e = error_of([&] { load(state, c); });
    EXPECT_NE(e.find("decompresses to more than 1048640 bytes"), std::string::npos) << e;
  }
  {  // a corrupt byte inside the frame
    rewrite_metadata(c, original);
    const std::string path = c + "/" + info.relative_path;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(info.offset + info.length / 2);
    f.write("\x7f\x00\x13\x55\x7f\x00\x13\x55", 8);
    f.close();
    const std::string e = load_error();
    EXPECT_NE(e.find(info.relative_path), std::string::npos) << e;
    const VerifyReport report = verify(c);
    EXPECT_FALSE(report.problems.empty());
  }
}

}  // namespace
}  // namespace dcp

// ---------------------------------------------------------------------------------------------
// Saving without collectives (SaveOptions::use_collectives = false, Python's
// use_collectives=False): one "__{rank}.metadata" per rank, loads merge them at any world size.

namespace dcp {
namespace {

void save_local(const std::string& dir, Communicator& comm, int64_t seed,
                std::shared_ptr<SavePlanner> planner = nullptr) {
  const at::Tensor full = testing::make_tensor(at::kFloat, {9, 6}, seed);
  SaveOptions options;
  options.comm = &comm;
  options.use_collectives = false;
  options.planner = std::move(planner);
  save(StateDict{{"w", distribute_tensor(full, {comm.size()}, comm.rank(), {Placement::Shard(0)})},
                 {"step", seed}},
       dir, options);
}

void expect_loads_on_2_ranks(const std::string& dir, int64_t seed) {
  const at::Tensor full = testing::make_tensor(at::kFloat, {9, 6}, seed);
  run_in_process(2, [&](Communicator& comm) {
    StateDict state{{"w", zeros_sharded({9, 6}, at::kFloat, {2}, comm.rank(),
                                        {Placement::Shard(1)})},
                    {"step", 0}};
    LoadOptions options;
    options.comm = &comm;
    load(state, dir, options);
    const Shard& shard = state.at("w").get<ShardedTensor>().local_shards().at(0);
    EXPECT_TRUE(torch::equal(shard.tensor, full.narrow(1, shard.offsets[1], 3)));
    EXPECT_EQ(state.at("step"), Value(seed));
  });
}

TEST(WithoutCollectivesTest, EveryRankCommitsItsOwnMetadataAndLoadsMergeThem) {
  TempDir dir;
  run_in_process(3, [&](Communicator& comm) { save_local(dir.path(), comm, 1); });
  std::vector<std::string> metadata_files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = e.path().filename().string();
    if (name.find(".metadata") != std::string::npos) metadata_files.push_back(name);
  }
  std::sort(metadata_files.begin(), metadata_files.end());
  EXPECT_EQ(metadata_files,
            (std::vector<std::string>{"__0.metadata", "__1.metadata", "__2.metadata"}));
  expect_loads_on_2_ranks(dir.path(), 1);
  EXPECT_TRUE(verify(dir.path()).ok());

  // A re-save replaces each rank's metadata, then its old data files go.
  run_in_process(3, [&](Communicator& comm) { save_local(dir.path(), comm, 2); });
  expect_loads_on_2_ranks(dir.path(), 2);
  int data_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    data_files += e.path().extension() == ".distcp";
  }
  EXPECT_EQ(data_files, 3);
}

TEST(WithoutCollectivesTest, AFailureOnOneRankReachesEveryRank) {
  TempDir dir;
  std::vector<std::string> errors(3);
  run_in_process(3, [&](Communicator& comm) {
    try {
      save_local(dir.path(), comm, 1,
                 comm.rank() == 1 ? std::make_shared<testing::FailingSavePlanner>(0) : nullptr);
    } catch (const c10::Error& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("rank 1"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/__1.metadata"));
}

TEST(WithoutCollectivesTest, RefusesADirectoryThatHoldsACollectiveCheckpoint) {
  TempDir dir;
  save(StateDict{{"x", 1}}, dir.path());
  SingleProcessCommunicator comm;
  try {
    save_local(dir.path(), comm, 1);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a checkpoint saved with collectives"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dcp
