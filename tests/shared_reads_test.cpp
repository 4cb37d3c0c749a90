// Read once, broadcast (LoadOptions::read_once, Note [Read once, broadcast]): which reads the
// coordinator shares (plan_shared_reads), that every rank gets bitwise what per-rank reads give,
// that each shared box is read from storage by exactly one rank, destinations that need a copy
// (another dtype, not contiguous), and a failing destination or read on one rank raising on all.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>

#include "dcp/dcp.h"
#include "protocol/shared_reads.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using detail::plan_shared_reads;

ReadItem box(const std::string& fqn, std::vector<int64_t> chunk, std::vector<int64_t> offsets,
             std::vector<int64_t> lengths) {
  ReadItem item;
  item.dest_index = MetadataIndex(fqn, chunk);
  item.dest_offsets = std::vector<int64_t>(lengths.size(), 0);
  item.storage_index = MetadataIndex(fqn, std::move(chunk));
  item.storage_offsets = std::move(offsets);
  item.lengths = std::move(lengths);
  return item;
}

Metadata metadata_of(const std::map<std::string, std::vector<int64_t>>& tensors) {
  Metadata md;
  for (const auto& [fqn, size] : tensors) {
    TensorStorageMetadata t;
    t.size = size;
    md.state_dict_metadata[fqn] = t;
  }
  md.state_dict_metadata["step"] = BytesStorageMetadata{};
  return md;
}

TEST(PlanSharedReadsTest, SharesOnlyBoxesEveryRankReadsAlikeOnce) {
  const Metadata md = metadata_of({{"a", {64, 64}}, {"b", {8}}, {"c", {4, 4}}, {"d", {4}}});
  ReadItem step;
  step.type = LoadItemType::BYTE_IO;
  step.dest_index = step.storage_index = MetadataIndex("step");
  std::vector<LoadPlan> plans(3);
  for (int r = 0; r < 3; ++r) {
    plans[r].items.push_back(box("a", {0, 0}, {0, 0}, {64, 64}));             // every rank: shared
    plans[r].items.push_back(box("b", {0}, {0}, {8}));                        // every rank: shared
    plans[r].items.push_back(box("c", {0, 0}, {static_cast<int64_t>(r), 0}, {1, 4}));  // differ
    plans[r].items.push_back(step);                                           // bytes: not shared
  }
  plans[0].items.push_back(box("d", {0}, {0}, {4}));  // ranks 0 and 1 only: not shared
  plans[1].items.push_back(box("d", {0}, {0}, {4}));
  plans[2].items.push_back(box("b", {0}, {0}, {8}));  // rank 2 reads "b" twice: not shared

  const auto shared = plan_shared_reads(plans, md);
  ASSERT_EQ(shared.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(shared[r].size(), 1u) << "rank " << r;
    EXPECT_EQ(shared[r][0].item.storage_index.fqn, "a");
    EXPECT_EQ(shared[r][0].nbytes, 64 * 64 * 4);
    EXPECT_EQ(shared[r][0].root, 0);
    for (const auto& item : plans[r].items) EXPECT_NE(item.storage_index.fqn, "a");
  }
  EXPECT_EQ(plans[0].items.size(), 4u);  // b, c, step, d
  EXPECT_EQ(plans[2].items.size(), 4u);  // b, c, step, b
}

TEST(PlanSharedReadsTest, RootsBalanceWhatEachRankReads) {
  const Metadata md = metadata_of({{"x0", {256}}, {"x1", {256}}, {"x2", {256}}, {"x3", {256}},
                                   {"own", {1024}}});
  std::vector<LoadPlan> plans(2);
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 4; ++k) plans[r].items.push_back(box("x" + std::to_string(k), {0}, {0}, {256}));
  }
  plans[0].items.push_back(box("own", {0}, {0}, {1024}));  // rank 0 reads 4 KiB of its own
  const auto shared = plan_shared_reads(plans, md);
  ASSERT_EQ(shared[0].size(), 4u);
  for (const auto& s : shared[0]) EXPECT_EQ(s.root, 1) << s.item.storage_index.fqn;
  EXPECT_EQ(shared[1][3].root, 1);
  // One rank: nothing to share.
  std::vector<LoadPlan> one(1);
  one[0].items.push_back(box("x0", {0}, {0}, {256}));
  EXPECT_TRUE(plan_shared_reads(one, md)[0].empty());
}

// Records, per storage box, how many ranks read it from storage.
class CountingReader : public StorageReaderWrapper {
 public:
  CountingReader(std::shared_ptr<StorageReader> target, std::map<std::string, int>* reads,
                 std::mutex* mu)
      : StorageReaderWrapper(std::move(target)), reads_(reads), mu_(mu) {}
  std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) override {
    {
      std::lock_guard<std::mutex> lock(*mu_);
      for (const auto& item : plan.items) ++(*reads_)[item.storage_index.fqn];
    }
    return StorageReaderWrapper::read_data(plan, planner);
  }

 private:
  std::map<std::string, int>* reads_;
  std::mutex* mu_;
};

constexpr int kWorld = 4;

// Replicated tensors large and small (packed), of several dtypes, a 0-d one, a row-sharded
// tensor and a non-tensor value.
StateDict replicated_state(bool zeros) {
  StateDict sd;
  auto t = [&](c10::ScalarType dtype, std::vector<int64_t> shape, int64_t seed) {
    at::Tensor v = testing::make_tensor(dtype, shape, seed);
    return zeros ? at::zeros_like(v) : v;
  };
  sd["big"] = t(at::kFloat, {512, 1024}, 1);  // 2 MiB: its own broadcast
  sd["big_bf16"] = t(at::kBFloat16, {1024, 768}, 2);
  for (int i = 0; i < 40; ++i) sd["small." + std::to_string(i)] = t(at::kFloat, {16, 16 + i}, 10 + i);
  sd["scalar"] = t(at::kDouble, {}, 3);
  sd["ints"] = t(at::kLong, {33}, 4);
  sd["step"] = zeros ? Value(0) : Value(7);
  return sd;
}

StateDict with_sharded(StateDict sd, int rank, bool zeros) {
  const std::vector<int64_t> shape{10, 6};
  const at::Tensor full = testing::make_tensor(at::kFloat, shape, 99);
  const auto b = compute_local_box(shape, {kWorld}, {rank}, {Placement::Shard(0)});
  at::Tensor local = full.narrow(0, b.offsets[0], b.sizes[0]).clone();
  sd["sharded"] = ShardedTensor(shape, at::kFloat, {Shard{zeros ? at::zeros_like(local) : local, b.offsets}});
  return sd;
}

void save_replicated(MemoryStorage& storage) {
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd = with_sharded(replicated_state(false), comm.rank(), false);
    MemoryWriter writer(storage, "ckpt");
    SaveOptions options;
    options.comm = &comm;
    save(sd, writer, options);
  });
}

// Loads on kWorld ranks; returns how many ranks read each key from storage.
std::map<std::string, int> load_replicated(MemoryStorage& storage, bool read_once) {
  std::map<std::string, int> reads;
  std::mutex mu;
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd = with_sharded(replicated_state(true), comm.rank(), true);
    CountingReader reader(std::make_shared<MemoryReader>(storage, "ckpt"), &reads, &mu);
    LoadOptions options;
    options.comm = &comm;
    options.read_once = read_once;
    load(sd, reader, options);
    const StateDict expected = with_sharded(replicated_state(false), comm.rank(), false);
    const std::string diff = testing::describe_difference(Value(expected), Value(sd));
    EXPECT_EQ(diff, "") << "rank " << comm.rank() << " read_once " << read_once;
  });
  return reads;
}

TEST(ReadOnceTest, EachReplicatedBoxIsReadByOneRankAndEveryRankGetsItBitwise) {
  MemoryStorage storage;
  save_replicated(storage);
  const auto once = load_replicated(storage, true);
  const auto every = load_replicated(storage, false);
  for (const auto& [key, n] : every) {
    const bool replicated = key != "sharded" && key != "step";
    EXPECT_EQ(n, kWorld) << key << ": every rank reads it without read_once";
    EXPECT_EQ(once.count(key) ? once.at(key) : 0, replicated ? 1 : kWorld) << key;
  }
  EXPECT_EQ(every.size(), 46u);  // 44 replicated tensors, "sharded", "step"
}

TEST(ReadOnceTest, RootsAreSpreadOverTheRanks) {
  MemoryStorage storage;
  save_replicated(storage);
  std::set<int> readers;
  std::mutex mu;
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd = replicated_state(true);
    std::map<std::string, int> reads;
    std::mutex own;
    CountingReader reader(std::make_shared<MemoryReader>(storage, "ckpt"), &reads, &own);
    LoadOptions options;
    options.comm = &comm;
    load(sd, reader, options);
    std::lock_guard<std::mutex> lock(mu);
    if (reads.count("big") || reads.count("big_bf16") || reads.count("small.0")) readers.insert(comm.rank());
  });
  EXPECT_GE(readers.size(), 2u) << "one rank read every replicated tensor";
}

TEST(ReadOnceTest, DestinationsOfAnotherDtypeOrLayoutGetTheSavedBytesCast) {
  MemoryStorage storage;
  save_replicated(storage);
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd = replicated_state(true);
    // Rank 1 holds "big" as double, rank 2 as a transposed (non-contiguous) view.
    at::Tensor big_t;
    if (comm.rank() == 1) sd["big"] = at::zeros({512, 1024}, at::kDouble);
    if (comm.rank() == 2) {
      big_t = at::zeros({1024, 512});
      sd["big"] = big_t.t();
    }
    MemoryReader reader(storage, "ckpt");
    LoadOptions options;
    options.comm = &comm;
    options.planner_options.allow_dtype_cast = true;
    load(sd, reader, options);
    const at::Tensor expected = testing::make_tensor(at::kFloat, {512, 1024}, 1);
    EXPECT_TRUE(at::equal(sd["big"].tensor().to(at::kFloat), expected)) << "rank " << comm.rank();
    if (comm.rank() == 2) EXPECT_TRUE(at::equal(big_t.t(), expected));
    EXPECT_TRUE(at::equal(sd["small.3"].tensor(), testing::make_tensor(at::kFloat, {16, 19}, 13)));
  });
}

// commit_tensor fails on rank 2 for one packed and one large box.
class FailingCommitPlanner : public DefaultLoadPlanner {
 public:
  explicit FailingCommitPlanner(bool fail) : fail_(fail) {}
  void commit_tensor(const ReadItem& item, const at::Tensor& tensor) override {
    if (fail_ && (item.dest_index.fqn == "small.5" || item.dest_index.fqn == "big")) {
      TORCH_CHECK(false, "injected: commit_tensor of '", item.dest_index.fqn, "'");
    }
    DefaultLoadPlanner::commit_tensor(item, tensor);
  }

 private:
  bool fail_;
};

TEST(ReadOnceTest, AFailingDestinationOnOneRankRaisesOnEveryRankAfterTheBroadcasts) {
  MemoryStorage storage;
  save_replicated(storage);
  std::vector<std::string> messages(kWorld);
  std::vector<int> rest_loaded(kWorld, 0);  // one element per thread (not vector<bool>)
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd = replicated_state(true);
    MemoryReader reader(storage, "ckpt");
    LoadOptions options;
    options.comm = &comm;
    options.timeout = std::chrono::seconds(60);
    options.planner = std::make_shared<FailingCommitPlanner>(comm.rank() == 2);
    try {
      load(sd, reader, options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
    rest_loaded[comm.rank()] =
        at::equal(sd["small.39"].tensor(), testing::make_tensor(at::kFloat, {16, 55}, 49));
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(messages[r].find("failed on rank 2 of 4"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("step 'read'"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("injected: commit_tensor of '"), std::string::npos) << messages[r];
    EXPECT_TRUE(rest_loaded[r]) << "rank " << r << " stopped delivering after the failure";
  }
}

// A root whose storage read fails still sends every broadcast it roots; every rank raises the
// read's error and none waits for the deadline.
class FailingReader : public StorageReaderWrapper {
 public:
  FailingReader(std::shared_ptr<StorageReader> target, bool fail)
      : StorageReaderWrapper(std::move(target)), fail_(fail) {}
  std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) override {
    TORCH_CHECK(!fail_, "injected: read_data of ", plan.items.size(), " items");
    return StorageReaderWrapper::read_data(plan, planner);
  }

 private:
  bool fail_;
};

TEST(ReadOnceTest, AFailingReadOnARootRaisesOnEveryRankWithoutWaiting) {
  MemoryStorage storage;
  save_replicated(storage);
  std::vector<std::string> messages(kWorld);
  const auto start = std::chrono::steady_clock::now();
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd = replicated_state(true);
    FailingReader reader(std::make_shared<MemoryReader>(storage, "ckpt"), comm.rank() == 1);
    LoadOptions options;
    options.comm = &comm;
    options.timeout = std::chrono::seconds(60);
    try {
      load(sd, reader, options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(messages[r].find("step 'read' failed on rank 1 of 4"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("injected: read_data"), std::string::npos) << messages[r];
  }
}

}  // namespace
}  // namespace dcp
