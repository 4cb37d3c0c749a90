// The storage conformance suite: every StorageWriter/StorageReader backend must pass the same
// tests through dcp::save / dcp::load (Arrow's GenericFileSystemTest, tensorstore's
// RegisterKeyValueStoreOpsTests). A backend's test file implements StorageBackend, includes
// this header (in exactly one translation unit of its test binary) and instantiates the suite:
//
//   #include "testing/storage_conformance.h"
//   class MyBackend : public dcp::testing::StorageBackend { ... };
//   INSTANTIATE_TEST_SUITE_P(Mine, dcp::testing::StorageConformanceTest,
//       ::testing::Values(std::make_pair("Mine", dcp::testing::StorageBackendFactory(
//           [] { return std::make_unique<MyBackend>(); }))));
//
// tests/storage_test.cpp runs it against the file system (fast and simple paths) and the
// in-memory storage. Link against dcp_testing (tests/testing/).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dcp/dcp.h"
#include "testing/test_util.h"

namespace dcp::testing {

/// A storage backend under test: makes writers and readers for checkpoint ids, and reaches
/// into the stored files so the suite can damage them.
class StorageBackend {
 public:
  virtual ~StorageBackend() = default;
  virtual std::unique_ptr<StorageWriter> writer(const std::string& id, int threads,
                                                bool single_file_per_rank) = 0;
  virtual std::unique_ptr<StorageReader> reader(const std::string& id) = 0;
  virtual std::vector<std::string> files(const std::string& id) = 0;
  /// Cuts file `name` of checkpoint `id` to its first n bytes.
  virtual void truncate(const std::string& id, const std::string& name, size_t n) = 0;
  virtual size_t file_size(const std::string& id, const std::string& name) = 0;
};

using StorageBackendFactory = std::function<std::unique_ptr<StorageBackend>()>;

/// The suite: parameterized by (name, factory); each test gets a fresh backend.
class StorageConformanceTest
    : public ::testing::TestWithParam<std::pair<const char*, StorageBackendFactory>> {
 protected:
  void SetUp() override { backend_ = GetParam().second(); }

  void save_to(const std::string& id, const StateDict& sd, int threads = 1,
               bool single_file = true) {
    auto w = backend_->writer(id, threads, single_file);
    save(sd, *w);
  }
  StateDict load_from(const std::string& id, const StateDict& like) {
    StateDict out = testing::blank_like(like);
    auto r = backend_->reader(id);
    load(out, *r);
    return out;
  }
  void expect_same(const StateDict& expected, const StateDict& actual) {
    const std::string diff = testing::describe_difference(Value(expected), Value(actual));
    EXPECT_TRUE(diff.empty()) << diff;
  }

  std::unique_ptr<StorageBackend> backend_;
};

TEST_P(StorageConformanceTest, RoundTripIsBitwise) {
  const StateDict sd = testing::reference_state_dict();
  save_to("ckpt", sd);
  expect_same(sd, load_from("ckpt", sd));
  EXPECT_EQ(backend_->files("ckpt"), (std::vector<std::string>{".metadata", "__0_0.distcp"}));
}

TEST_P(StorageConformanceTest, EachDataFileEndsWithItsLastRecord) {
  // FileSystemWriter allocates a data file's expected size before O_DIRECT writes, then trims
  // it: no file may keep bytes past its last record.
  const StateDict sd = testing::reference_state_dict();
  auto w = backend_->writer("ckpt", 4, true);
  const Metadata md = save(sd, *w);
  std::map<std::string, int64_t> end_of;
  for (const auto& [index, info] : md.storage_data) {
    end_of[info.relative_path] = std::max(end_of[info.relative_path], info.offset + info.length);
  }
  ASSERT_EQ(end_of.size(), 4u);
  for (const auto& [file, end] : end_of) {
    EXPECT_EQ(backend_->file_size("ckpt", file), static_cast<size_t>(end)) << file;
  }
}

TEST_P(StorageConformanceTest, ThreadCountSpreadsItemsOverThatManyFiles) {
  const StateDict sd = testing::reference_state_dict();
  save_to("ckpt", sd, 4);
  EXPECT_EQ(backend_->files("ckpt"),
            (std::vector<std::string>{".metadata", "__0_0.distcp", "__0_1.distcp",
                                      "__0_2.distcp", "__0_3.distcp"}));
  expect_same(sd, load_from("ckpt", sd));
}

TEST_P(StorageConformanceTest, OneFilePerItem) {
  StateDict sd;
  sd["a"] = testing::make_tensor(at::kFloat, {3}, 1);
  sd["b"] = testing::make_tensor(at::kInt, {2, 2}, 2);
  sd["c"] = "text";
  save_to("ckpt", sd, 2, /*single_file=*/false);
  EXPECT_EQ(backend_->files("ckpt"), (std::vector<std::string>{".metadata", "__0_0.distcp",
                                                               "__0_1.distcp", "__0_2.distcp"}));
  expect_same(sd, load_from("ckpt", sd));
}

TEST_P(StorageConformanceTest, MissingCheckpointIsAClearError) {
  StateDict sd;
  sd["a"] = at::zeros({1});
  auto r = backend_->reader("nowhere");
  try {
    load(sd, *r);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint at"), std::string::npos) << e.what();
  }
}

TEST_P(StorageConformanceTest, TruncatedDataFileNamesFileAndRange) {
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {64}, 1);
  save_to("ckpt", sd);
  const size_t size = backend_->file_size("ckpt", "__0_0.distcp");
  backend_->truncate("ckpt", "__0_0.distcp", size / 2);
  try {
    load_from("ckpt", sd);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'__0_0.distcp'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, " + std::to_string(size) + ")"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  }
}

TEST_P(StorageConformanceTest, CorruptMetadataIsAClearError) {
  StateDict sd;
  sd["w"] = at::zeros({2});
  save_to("ckpt", sd);
  backend_->truncate("ckpt", ".metadata", backend_->file_size("ckpt", ".metadata") - 9);
  try {
    load_from("ckpt", sd);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(".metadata"), std::string::npos) << e.what();
  }
}

TEST_P(StorageConformanceTest, FailedSaveLeavesNoMetadataAndOtherCheckpointsIntact) {
  const StateDict sd = testing::reference_state_dict();
  save_to("good", sd);
  for (FaultPoint point : {FaultPoint::kWriteData, FaultPoint::kFinish}) {
    std::shared_ptr<StorageWriter> real = backend_->writer("bad", 1, true);
    FaultInjectionWriter faulty(real, point);
    EXPECT_THROW(save(sd, faulty), c10::Error);
    const auto files = backend_->files("bad");
    EXPECT_EQ(std::count(files.begin(), files.end(), ".metadata"), 0);
    auto r = backend_->reader("bad");
    StateDict dest = testing::blank_like(sd);
    EXPECT_THROW(load(dest, *r), c10::Error);
  }
  // A planner failing midway through the writes.
  {
    auto real = backend_->writer("bad", 2, true);
    SaveOptions options;
    options.planner = std::make_shared<testing::FailingSavePlanner>(5);
    EXPECT_THROW(save(sd, *real, options), c10::Error);
    const auto files = backend_->files("bad");
    EXPECT_EQ(std::count(files.begin(), files.end(), ".metadata"), 0);
  }
  expect_same(sd, load_from("good", sd));
}

// Issue #13, finding 9: a re-save that fails at any point leaves the previous checkpoint
// loadable, bit for bit; a re-save that commits replaces it and leaves none of its files.
TEST_P(StorageConformanceTest, FailedResaveKeepsThePreviousCheckpointLoadable) {
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {16}, 1);
  sd["note"] = std::string(5000, 'n');
  save_to("ckpt", sd);
  const auto before = backend_->files("ckpt");
  StateDict bigger;
  bigger["w"] = testing::make_tensor(at::kFloat, {16}, 2);
  bigger["note"] = std::string(6000, 'm');
  bigger["extra"] = testing::make_tensor(at::kFloat, {1000}, 3);
  for (FaultPoint point : {FaultPoint::kResolveData, FaultPoint::kWriteData, FaultPoint::kFinish}) {
    std::shared_ptr<StorageWriter> real = backend_->writer("ckpt", 1, true);
    SaveOptions options;
    FaultInjectionWriter faulty(real, point == FaultPoint::kResolveData ? FaultPoint::kNone
                                                                         : point);
    if (point == FaultPoint::kResolveData) {
      options.planner = std::make_shared<testing::FailingSavePlanner>(1);
    }
    EXPECT_THROW(save(bigger, faulty, options), c10::Error);
    expect_same(sd, load_from("ckpt", sd));
  }
  // A successful re-save replaces it and removes the files only the old one used.
  save_to("ckpt", bigger);
  expect_same(bigger, load_from("ckpt", bigger));
  const auto after = backend_->files("ckpt");
  for (const std::string& name : before) {
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".distcp") == 0) {
      EXPECT_EQ(std::count(after.begin(), after.end(), name), 0) << name << " stayed";
    }
  }
  for (const std::string& name : after) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

}  // namespace dcp::testing
