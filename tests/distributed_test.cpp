// The multi-rank protocol, with N threads as N ranks (InProcessCommunicator): resharding
// between world sizes and layouts, de-duplication of replicated items, the edge cases of the
// protocol, failure propagation (and DistWrapper, which carries it) and the shared-directory
// check.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>

#include "dcp/dcp.h"
#include "protocol/dist_wrapper.h"
#include "testing/sharded_state.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using testing::Layout;

Metadata save_world(MemoryStorage& storage, const std::string& id, int world, Layout layout) {
  Metadata md;
  std::mutex mu;
  run_in_process(world, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), world, layout, false);
    MemoryWriter writer(storage, id);
    SaveOptions options;
    options.comm = &comm;
    Metadata m = save(sd, writer, options);
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) md = m;
  });
  return md;
}

TEST(InProcessCommunicatorTest, CollectivesDeliverWhatTheyPromise) {
  run_in_process(4, [](Communicator& comm) {
    const std::string me = "r" + std::to_string(comm.rank());
    TORCH_CHECK(comm.broadcast(me, 2) == "r2");
    auto g = comm.gather(me, 1);
    TORCH_CHECK(comm.rank() == 1 ? g == std::vector<std::string>({"r0", "r1", "r2", "r3"})
                                 : g.empty());
    std::vector<std::string> pieces;
    if (comm.rank() == 3) pieces = {"a", "", "ccc", "d"};
    const std::string mine = comm.scatter(pieces, 3);
    TORCH_CHECK(mine == std::vector<std::string>({"a", "", "ccc", "d"})[comm.rank()]);
    TORCH_CHECK(comm.all_gather(me).at(3) == "r3");
    comm.barrier();
  });
}

// DistWrapper carries each step's outcome with its status in a trailing byte (so a payload is
// wrapped and unwrapped without a copy): payloads of any bytes, the empty one and ones that end
// in the status bytes included, arrive whole, and so do broadcasts sent in one message or, when
// large, in two; an error keeps its type on every rank and names the ranks it came from.
TEST(DistWrapperTest, PayloadsArriveWholeAndErrorsKeepTheirTypeOnEveryRank) {
  constexpr int kWorld = 3;
  auto payload_of = [](int rank) {
    const std::string ends[] = {"", std::string("a\0", 2), std::string("\x01\x01", 2)};
    // Rank 2's is over the 1 MiB that a broadcast outcome carries in its first message.
    const size_t sizes[] = {0, 100000, (size_t{1} << 20) + 3};
    return ends[rank] + std::string(sizes[rank], 'x') + ends[rank];
  };
  std::vector<std::string> scattered(kWorld), reduced(kWorld), broadcast(kWorld);
  std::vector<std::vector<std::string>> gathered(kWorld);
  std::vector<std::string> value_errors(kWorld), type_errors(kWorld), not_implemented(kWorld);
  run_in_process(kWorld, [&](Communicator& comm) {
    detail::DistWrapper dist(comm, /*coordinator=*/1);
    const int r = comm.rank();
    scattered[r] = dist.reduce_scatter(
        "scatter", [&] { return payload_of(r); },
        [&](std::vector<std::string> all) {
          TORCH_CHECK(all.size() == kWorld);
          for (int k = 0; k < kWorld; ++k) TORCH_CHECK(all[k] == payload_of(k), "rank ", k);
          return std::vector<std::string>{all[2], all[0], all[1]};
        });
    reduced[r] = dist.all_reduce(
        "reduce", [&] { return payload_of(r); },
        [&](std::vector<std::string> all) { return all[0] + all[1] + all[2]; });
    broadcast[r] = dist.broadcast("broadcast", [&] { return payload_of(2); });
    gathered[r] = dist.all_gather("gather", [&] { return payload_of(r); });
    try {
      dist.all_reduce(
          "value", [&]() -> std::string {
            TORCH_CHECK_VALUE(r != 2, "bad value on ", r);
            return "";
          },
          [](std::vector<std::string>) { return std::string("unreached"); });
    } catch (const c10::ValueError& e) {
      value_errors[r] = e.what_without_backtrace();
    }
    try {
      dist.reduce_scatter(
          "type", [] { return std::string("fine"); },
          [](std::vector<std::string>) -> std::vector<std::string> {
            TORCH_CHECK_TYPE(false, "bad type in the global step");
          });
    } catch (const c10::TypeError& e) {
      type_errors[r] = e.what_without_backtrace();
    }
    try {
      dist.all_gather("missing", [&]() -> std::string {
        TORCH_CHECK_NOT_IMPLEMENTED(r == 1, "not here on ", r);
        return "";
      });
    } catch (const c10::NotImplementedError& e) {
      not_implemented[r] = e.what_without_backtrace();
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(scattered[r], payload_of((r + 2) % kWorld)) << r;
    EXPECT_EQ(reduced[r], payload_of(0) + payload_of(1) + payload_of(2)) << r;
    EXPECT_EQ(broadcast[r], payload_of(2)) << r;
    EXPECT_EQ(gathered[r], (std::vector<std::string>{payload_of(0), payload_of(1), payload_of(2)}));
    EXPECT_NE(value_errors[r].find("step 'value' failed on rank 2 of 3"), std::string::npos)
        << value_errors[r];
    EXPECT_NE(value_errors[r].find("bad value on 2"), std::string::npos) << value_errors[r];
    EXPECT_NE(type_errors[r].find("step 'type' failed on rank 1 of 3"), std::string::npos)
        << type_errors[r];
    EXPECT_NE(type_errors[r].find("bad type in the global step"), std::string::npos);
    EXPECT_NE(not_implemented[r].find("failed on ranks 0, 2 of 3"), std::string::npos)
        << not_implemented[r];
    EXPECT_NE(not_implemented[r].find("not here on 2"), std::string::npos);
  }
}

struct Resharding {
  int save_world;
  Layout save_layout;
  int load_world;
  Layout load_layout;
};

class ReshardingTest : public ::testing::TestWithParam<Resharding> {};

TEST_P(ReshardingTest, LoadsBitwiseAtAnotherWorldSizeAndLayout) {
  const Resharding p = GetParam();
  MemoryStorage storage;
  save_world(storage, "ckpt", p.save_world, p.save_layout);
  testing::load_in_process_and_check(storage, "ckpt", p.load_world, p.load_layout);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ReshardingTest,
    ::testing::Values(Resharding{4, Layout::kRow, 3, Layout::kRow},
                      Resharding{4, Layout::kRow, 1, Layout::kRow},
                      Resharding{3, Layout::kRow, 8, Layout::kColumn},
                      Resharding{6, Layout::kMesh2d, 4, Layout::kRow},
                      Resharding{2, Layout::kColumn, 6, Layout::kMesh2d},
                      Resharding{8, Layout::kRow, 8, Layout::kRow}),
    [](const auto& info) {
      const Resharding& p = info.param;
      return std::string(testing::layout_name(p.save_layout)) + std::to_string(p.save_world) +
             "_to_" + testing::layout_name(p.load_layout) + std::to_string(p.load_world);
    });

TEST(DistributedSaveTest, ReplicatedItemsAreStoredOnceAndSpreadOverRanks) {
  MemoryStorage storage;
  constexpr int kWorld = 4;
  Metadata md;
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict sd;
    for (int i = 0; i < 8; ++i) sd["w" + std::to_string(i)] = testing::make_tensor(at::kFloat, {16, 16}, i);
    sd["step"] = 3;
    MemoryWriter writer(storage, "ckpt");
    SaveOptions options;
    options.comm = &comm;
    Metadata m = save(sd, writer, options);
    if (comm.rank() == 0) md = m;
  });
  std::set<std::string> files;
  for (int i = 0; i < 8; ++i) {
    const auto& t = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("w" + std::to_string(i)));
    EXPECT_EQ(t.chunks.size(), 1u);
    files.insert(md.storage_data.at(MetadataIndex("w" + std::to_string(i), std::vector<int64_t>{0, 0})).relative_path);
  }
  EXPECT_EQ(files.size(), static_cast<size_t>(kWorld)) << "replicated tensors all on one rank";
  StateDict dest;
  for (int i = 0; i < 8; ++i) dest["w" + std::to_string(i)] = at::zeros({16, 16});
  dest["step"] = 0;
  MemoryReader reader(storage, "ckpt");
  load(dest, reader);
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(at::equal(dest["w" + std::to_string(i)].tensor(), testing::make_tensor(at::kFloat, {16, 16}, i)));
  }
  EXPECT_EQ(dest["step"], Value(3));
}

TEST(DistributedSaveTest, EdgeCasesOfThePlan) {
  // Rank 2 has nothing at all; rank 1 only replicated items (all de-duplicated away or kept);
  // rank 0 holds every shard of a sharded tensor.
  MemoryStorage storage;
  const at::Tensor full = testing::make_tensor(at::kFloat, {5, 4}, 9);
  run_in_process(3, [&](Communicator& comm) {
    StateDict sd;
    if (comm.rank() == 0) {
      sd["sharded"] = ShardedTensor({5, 4}, at::kFloat,
                                    {Shard{full.narrow(0, 0, 2).clone(), {0, 0}},
                                     Shard{full.narrow(0, 2, 3).clone(), {2, 0}}});
    } else if (comm.rank() == 1) {
      sd["sharded"] = ShardedTensor({5, 4}, at::kFloat, {});
    }
    if (comm.rank() != 2) sd["rep"] = testing::make_tensor(at::kInt, {3}, 1);
    MemoryWriter writer(storage, "ckpt");
    SaveOptions options;
    options.comm = &comm;
    save(sd, writer, options);
  });
  StateDict dest;
  dest["sharded"] = at::zeros({5, 4});
  dest["rep"] = at::zeros({3}, at::kInt);
  MemoryReader reader(storage, "ckpt");
  load(dest, reader);
  EXPECT_TRUE(at::equal(dest["sharded"].tensor(), full));
  EXPECT_TRUE(at::equal(dest["rep"].tensor(), testing::make_tensor(at::kInt, {3}, 1)));
  // Every rank created its file, even rank 2 with nothing to write.
  const auto files = storage.list("ckpt");
  EXPECT_EQ(std::count(files.begin(), files.end(), "__2_0.distcp"), 1);
}

TEST(DistributedSaveTest, AFailureOnOneRankRaisesOnEveryRankAndKeepsTheLastCheckpoint) {
  MemoryStorage storage;
  save_world(storage, "ckpt", 4, Layout::kRow);
  std::vector<std::string> messages(4);
  run_in_process(4, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), 4, Layout::kRow, false);
    auto real = std::make_shared<MemoryWriter>(storage, "ckpt");
    testing::FaultInjectionWriter faulty(
        real, comm.rank() == 2 ? testing::FaultPoint::kWriteData : testing::FaultPoint::kNone);
    SaveOptions options;
    options.comm = &comm;
    try {
      save(sd, faulty, options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(messages[r].find("failed on rank 2 of 4"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("injected fault"), std::string::npos) << messages[r];
  }
  // The failed re-save left the previous checkpoint loadable (issue #13, finding 9); a new
  // save there works again.
  testing::load_in_process_and_check(storage, "ckpt", 2, Layout::kRow);
  save_world(storage, "ckpt", 4, Layout::kRow);
  testing::load_in_process_and_check(storage, "ckpt", 2, Layout::kRow);
}

TEST(DistributedSaveTest, AFailedSaveElsewhereLeavesTheEarlierCheckpointLoadable) {
  testing::TempDir dir;
  run_in_process(3, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), 3, Layout::kRow, false);
    SaveOptions options;
    options.comm = &comm;
    save(sd, dir.sub("step_1"), options);
    auto real = std::make_shared<FileSystemWriter>(dir.sub("step_2"));
    testing::FaultInjectionWriter faulty(
        real, comm.rank() == 1 ? testing::FaultPoint::kWriteData : testing::FaultPoint::kNone);
    EXPECT_THROW(save(sd, faulty, options), c10::Error);
  });
  EXPECT_FALSE(std::filesystem::exists(dir.sub("step_2/.metadata")));
  run_in_process(2, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), 2, Layout::kColumn, true);
    LoadOptions options;
    options.comm = &comm;
    load(sd, dir.sub("step_1"), options);
    const std::string diff = testing::check_sharded_state(sd, comm.rank(), 2, Layout::kColumn);
    TORCH_CHECK(diff.empty(), diff);
  });
}

TEST(DistributedSaveTest, NonSharedDirectoriesAreDetectedBeforeAnyDataIsWritten) {
  testing::TempDir dir;
  std::vector<std::string> messages(3);
  run_in_process(3, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), 3, Layout::kRow, false);
    SaveOptions options;
    options.comm = &comm;
    try {
      save(sd, dir.sub("node" + std::to_string(comm.rank())), options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("not shared by all ranks: rank(s) 1, 2"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.sub("node0/__0_0.distcp")));
  EXPECT_FALSE(std::filesystem::exists(dir.sub("node0/.metadata")));

  // The documented switch turns the check off.
  run_in_process(2, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), 2, Layout::kRow, false);
    FileSystemWriterOptions o;
    o.check_shared_directory = false;
    FileSystemWriter writer(dir.sub("shared"), o);
    SaveOptions options;
    options.comm = &comm;
    save(sd, writer, options);
  });
  EXPECT_TRUE(std::filesystem::exists(dir.sub("shared/.metadata")));
}

TEST(DistributedLoadTest, AMissingKeyOnOneRankRaisesOnAllRanks) {
  MemoryStorage storage;
  save_world(storage, "ckpt", 2, Layout::kRow);
  std::vector<std::string> messages(2);
  run_in_process(2, [&](Communicator& comm) {
    StateDict sd = testing::sharded_state(comm.rank(), 2, Layout::kRow, true);
    if (comm.rank() == 1) sd["renamed"] = at::zeros({1});
    MemoryReader reader(storage, "ckpt");
    LoadOptions options;
    options.comm = &comm;
    try {
      load(sd, reader, options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("failed on rank 1 of 2"), std::string::npos) << m;
    EXPECT_NE(m.find("'renamed'"), std::string::npos) << m;
  }
}

// Python's enable_plan_caching (Note [Plan caching]): repeated saves of an unchanged layout
// reuse the coordinator's global plan and Metadata; a changed plan on one rank is re-planned;
// the data is always the current step's.
TEST(PlanCachingTest, RepeatedSavesReuseTheGlobalPlanAndChangesAreReplanned) {
  testing::TempDir dir;
  constexpr int kWorld = 3;
  std::vector<std::shared_ptr<DefaultSavePlanner>> planners;
  for (int r = 0; r < kWorld; ++r) {
    DefaultSavePlannerOptions o;
    o.enable_plan_caching = true;
    planners.push_back(std::make_shared<DefaultSavePlanner>(o));
  }
  // Step `step` of a state whose values change every step; from step 3 rank 2 has an extra key.
  auto state_at = [](int rank, int step) {
    StateDict sd = testing::sharded_state(rank, kWorld, Layout::kRow, false);
    sd["at_step"] = int64_t{step};
    sd["w_step"] = torch::full({4, 3}, static_cast<float>(step));
    if (step >= 3 && rank == 2) sd["extra_step"] = torch::arange(5) * step;
    return sd;
  };
  // Saves make_state(rank) as checkpoint `id` on every rank, each with its planner; returns
  // the coordinator's Metadata and each rank's error ("" when it succeeded).
  auto save_all = [&](const std::string& id, const std::function<StateDict(int)>& make_state) {
    Metadata md;
    std::vector<std::string> errors(kWorld);
    run_in_process(kWorld, [&](Communicator& comm) {
      SaveOptions options;
      options.comm = &comm;
      options.planner = planners[comm.rank()];
      try {
        Metadata m = save(make_state(comm.rank()), id, options);
        if (comm.rank() == 0) md = std::move(m);
      } catch (const c10::Error& e) {
        errors[comm.rank()] = e.what();
      }
    });
    return std::make_pair(std::move(md), std::move(errors));
  };
  auto float64_w = [&](int rank) {
    StateDict sd = state_at(rank, 4);
    sd["w_step"] = torch::full({4, 3}, 4.0, torch::kFloat64);
    return sd;
  };
  std::vector<Metadata> saved(5);
  for (int step = 1; step <= 4; ++step) {
    const std::string id = dir.sub("save" + std::to_string(step));
    auto [md, errors] = save_all(id, [&](int rank) { return state_at(rank, step); });
    for (const auto& e : errors) ASSERT_EQ(e, "");
    saved[step] = std::move(md);
    // Every step loads back as its own values, on another world size too.
    for (int world : {kWorld, 2}) {
      run_in_process(world, [&](Communicator& comm) {
        StateDict dest = testing::sharded_state(comm.rank(), world, Layout::kRow, true);
        dest["at_step"] = int64_t{0};
        dest["w_step"] = torch::zeros({4, 3});
        LoadOptions options;
        options.comm = &comm;
        options.strict = StrictHandling::kReturnAll;
        load(dest, id, options);
        TORCH_CHECK(dest.at("at_step").get<int64_t>() == step, "step ", step);
        TORCH_CHECK(torch::equal(dest.at("w_step").tensor(), torch::full({4, 3}, float(step))));
        dest.erase("at_step");
        dest.erase("w_step");
        const std::string diff =
            testing::check_sharded_state(dest, comm.rank(), world, Layout::kRow);
        TORCH_CHECK(diff.empty(), diff);
      });
    }
  }
  // A cached plan re-saved over an existing checkpoint: the writer's file names for this save
  // (unique, Note [Re-save]) are used, not the cached plan's, so the old files stay intact
  // until the commit; the new values load.
  saved[0] = save_all(dir.sub("save4"), [&](int rank) { return state_at(rank, 9); }).first;
  std::set<std::string> old_files, new_files;
  for (const auto& entry : saved[4].storage_data) old_files.insert(entry.second.relative_path);
  for (const auto& entry : saved[0].storage_data) new_files.insert(entry.second.relative_path);
  for (const auto& f : new_files) EXPECT_EQ(old_files.count(f), 0u) << f;
  run_in_process(kWorld, [&](Communicator& comm) {
    StateDict dest{{"w_step", torch::zeros({4, 3})}};
    LoadOptions options;
    options.comm = &comm;
    options.strict = StrictHandling::kReturnAll;
    load(dest, dir.sub("save4"), options);
    TORCH_CHECK(torch::equal(dest.at("w_step").tensor(), torch::full({4, 3}, 9.0f)));
  });
  EXPECT_TRUE(verify(dir.sub("save4")).ok());

  const auto stats = planners[0]->plan_cache_stats();
  EXPECT_EQ(stats.global_plans, 5);
  EXPECT_EQ(stats.global_plan_hits, 3);  // steps 2, 4 and 9; step 3 changed rank 2's plan
  EXPECT_EQ(planners[1]->plan_cache_stats().global_plans, 0);  // not the coordinator
  EXPECT_TRUE(saved[2].state_dict_metadata == saved[1].state_dict_metadata);
  EXPECT_TRUE(saved[3].state_dict_metadata.contains("extra_step"));
  EXPECT_TRUE(saved[4].state_dict_metadata == saved[3].state_dict_metadata);
  EXPECT_EQ(saved[4].storage_data.size(), saved[3].storage_data.size());

  // A dtype change is a new plan (Python's comparison ignores dtypes and would reuse the old
  // metadata): the checkpoint records the new dtype.
  const std::string id = dir.sub("dtype");
  for (const auto& e : save_all(id, float64_w).second) ASSERT_EQ(e, "");
  EXPECT_EQ(planners[0]->plan_cache_stats().global_plan_hits, 3);
  const Metadata md = FileSystemReader(id).read_metadata();
  EXPECT_EQ(std::get<TensorStorageMetadata>(md.state_dict_metadata.at("w_step")).properties.dtype,
            c10::ScalarType::Double);

  // A coordinator whose planner lost its cache while the other ranks kept theirs: a clear
  // error on every rank, and nothing committed.
  DefaultSavePlannerOptions o;
  o.enable_plan_caching = true;
  planners[0] = std::make_shared<DefaultSavePlanner>(o);
  const std::string lost = dir.sub("lost");
  for (const auto& e : save_all(lost, float64_w).second) {
    EXPECT_NE(e.find("plan caching: rank(s) 1, 2 sent"), std::string::npos) << e;
    EXPECT_NE(e.find("has no cached plans"), std::string::npos) << e;
  }
  EXPECT_FALSE(std::filesystem::exists(lost + "/.metadata"));
}

}  // namespace
}  // namespace dcp
