// Default planners: de-duplication, the global plan and its validation, resharding reads, and
// the load planner's errors.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcp/planner.h"
#include "storage_data.h"
#include "util/name_interner.h"
#include "planner/planner_helpers.h"
#include "protocol/plan_codec.h"

namespace dcp {
namespace {

WriteItem tensor_item(const std::string& fqn, std::vector<int64_t> offsets,
                      std::vector<int64_t> sizes, std::vector<int64_t> global) {
  WriteItem item;
  item.type = WriteItemType::SHARD;
  item.index = MetadataIndex(fqn, offsets);
  item.tensor_data =
      TensorWriteData{{Dims(offsets), Dims(sizes)}, TensorProperties{}, Dims(global)};
  return item;
}

WriteItem bytes_item(const std::string& fqn) {
  WriteItem item;
  item.index = MetadataIndex(fqn);
  return item;
}

// Two ranks' plans, each with one item.
std::vector<SavePlan> two_plans(WriteItem on_rank0, WriteItem on_rank1) {
  std::vector<SavePlan> plans(2);
  plans[0].items.push_back(std::move(on_rank0));
  plans[1].items.push_back(std::move(on_rank1));
  return plans;
}

// The global plan rejects `plans` with a c10::ValueError whose message contains `what`.
void expect_invalid(std::vector<SavePlan> plans, const char* what) {
  try {
    detail::create_default_global_save_plan(std::move(plans));
    ADD_FAILURE() << what << ": accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(DedupTest, ReplicatedItemsAreSpreadToBalanceBytes) {
  std::vector<SavePlan> plans(3);
  for (auto& p : plans) {
    p.items.push_back(tensor_item("big", {0}, {100}, {100}));   // 400 bytes
    p.items.push_back(tensor_item("mid", {0}, {50}, {50}));     // 200 bytes
    p.items.push_back(tensor_item("small", {0}, {10}, {10}));   // 40 bytes
    p.items.push_back(bytes_item("step"));
  }
  auto out = detail::dedup_save_plans(plans, false);
  ASSERT_EQ(out.size(), 3u);
  // big -> rank 0 (all empty, lowest); mid -> rank 1; small -> rank 2; step -> rank 2 (40 < 200).
  ASSERT_EQ(out[0].items.size(), 1u);
  EXPECT_EQ(out[0].items[0].index.fqn, "big");
  ASSERT_EQ(out[1].items.size(), 1u);
  EXPECT_EQ(out[1].items[0].index.fqn, "mid");
  ASSERT_EQ(out[2].items.size(), 2u);
  EXPECT_EQ(out[2].items[0].index.fqn, "small");
  EXPECT_EQ(out[2].items[1].index.fqn, "step");

  auto lowest = detail::dedup_save_plans(plans, true);
  EXPECT_EQ(lowest[0].items.size(), 4u);
  EXPECT_TRUE(lowest[1].items.empty());
  EXPECT_TRUE(lowest[2].items.empty());
}

TEST(DedupTest, FirstSeenOrderAndReplicatedShardsOfAMesh) {
  // Mesh (2, 2) with [Shard(0), Replicate()]: ranks 0,1 hold rows 0-1 of "w", ranks 2,3 rows
  // 2-3; every rank holds "step"; rank 1 also a private 400-byte tensor, listed first.
  std::vector<SavePlan> plans(4);
  plans[1].items.push_back(tensor_item("private", {0}, {100}, {100}));  // 400 bytes
  for (int r = 0; r < 4; ++r) {
    const int64_t row = r < 2 ? 0 : 2;
    plans[r].items.push_back(tensor_item("w", {row, 0}, {2, 4}, {4, 4}));  // weight 64
    plans[r].items.push_back(bytes_item("step"));
  }
  auto out = detail::dedup_save_plans(plans, false);
  auto names = [&](int r) {
    std::vector<std::string> n;
    for (const auto& i : out[r].items) {
      n.push_back(i.index.fqn + (i.index.offset && !i.index.offset->empty()
                                     ? "@" + std::to_string((*i.index.offset)[0])
                                     : ""));
    }
    return n;
  };
  // Keys in first-seen order: w@0 (rank 0), step (rank 0), private (rank 1), w@2 (rank 2).
  // w@0: totals 0,0 -> rank 0 (+64). step: totals 64,0,0,0 -> rank 1 (+1); private is only
  // counted when the walk reaches it. private: rank 1 (+400). w@2: totals 0,0 -> rank 2.
  EXPECT_EQ(names(0), (std::vector<std::string>{"w@0"}));
  EXPECT_EQ(names(1), (std::vector<std::string>{"private@0", "step"}));
  EXPECT_EQ(names(2), (std::vector<std::string>{"w@2"}));
  EXPECT_TRUE(names(3).empty());
}

TEST(StorageDataTest, AnyInputOrderGivesTheSameMapAndTheLastDuplicateWins) {
  std::vector<std::pair<MetadataIndex, StorageInfo>> entries;
  std::map<MetadataIndex, StorageInfo> expected;
  for (int r = 0; r < 8; ++r) {
    for (const char* fqn : {"b.w", "a.w", "model.layers.10.w", "model.layers.2.w"}) {
      MetadataIndex index(fqn, std::vector<int64_t>{(7 - r) * 3, 0});
      StorageInfo info{"__" + std::to_string(r) + "_0.distcp", r * 10, 10, {}};
      entries.emplace_back(index, info);
      expected.insert_or_assign(index, info);
    }
  }
  entries.emplace_back(MetadataIndex("step"), StorageInfo{"__0_0.distcp", 1, 1, {}});
  entries.emplace_back(MetadataIndex("step"), StorageInfo{"__5_0.distcp", 2, 1, {}});
  expected.insert_or_assign(MetadataIndex("step"), StorageInfo{"__5_0.distcp", 2, 1, {}});
  std::reverse(entries.begin(), entries.begin() + 32);  // any order of distinct keys
  const auto got = detail::make_storage_data(entries);
  ASSERT_EQ(got.size(), expected.size());
  auto e = expected.begin();
  for (const auto& [index, info] : got) {
    EXPECT_EQ(index, e->first);
    EXPECT_EQ(info, e->second) << index;
    ++e;
  }
}

TEST(GlobalPlanTest, ChunksInRankOrderWithIndexHints) {
  std::vector<SavePlan> plans(2);
  plans[0].items.push_back(tensor_item("w", {0, 0}, {2, 3}, {4, 3}));
  plans[1].items.push_back(tensor_item("w", {2, 0}, {2, 3}, {4, 3}));
  plans[1].items.push_back(bytes_item("step"));
  auto [final_plans, md] = detail::create_default_global_save_plan(plans);
  const auto& w = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("w"));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1].offsets, (Dims{2, 0}));
  EXPECT_EQ(final_plans[1].items[0].index.index, 1);
  EXPECT_TRUE(std::holds_alternative<BytesStorageMetadata>(md.state_dict_metadata.at("step")));
}

TEST(GlobalPlanTest, KeysAreInPythonsOrderRankByRankAsFirstMet) {
  // Python's create_default_global_save_plan fills a dict plan by plan, item by item.
  std::vector<SavePlan> plans(2);
  plans[0].items.push_back(tensor_item("z", {0}, {2}, {4}));
  plans[0].items.push_back(bytes_item("step"));
  plans[0].items.push_back(tensor_item("a", {0}, {3}, {3}));
  plans[1].items.push_back(tensor_item("m", {0}, {1}, {1}));
  plans[1].items.push_back(tensor_item("z", {2}, {2}, {4}));
  plans[1].items.push_back(bytes_item("b"));
  auto [final_plans, md] = detail::create_default_global_save_plan(plans);
  std::vector<std::string> keys;
  for (const auto& entry : md.state_dict_metadata) keys.push_back(entry.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "step", "a", "m", "b"}));
  EXPECT_EQ(std::get<TensorStorageMetadata>(md.state_dict_metadata.at("z")).chunks.size(), 2u);
}

TEST(OrderedMapTest, IteratesInInsertionOrderAndComparesLikeADict) {
  OrderedMap<std::string, int> m;
  EXPECT_TRUE(m.emplace("b", 1).second);
  EXPECT_TRUE(m.emplace("a", 2).second);
  EXPECT_FALSE(m.emplace("b", 3).second);  // present: unchanged, as std::map::emplace
  const int* b = &m.at("b");
  for (int i = 0; i < 1000; ++i) m["k" + std::to_string(i)] = i;
  EXPECT_EQ(b, &m.at("b"));  // references stay valid as the map grows
  EXPECT_EQ(m.at("b"), 1);
  m.insert_or_assign("a", 5);
  EXPECT_EQ(m.begin()->first, "b");
  EXPECT_EQ(std::next(m.begin())->second, 5);
  EXPECT_EQ(m.size(), 1002u);
  EXPECT_EQ(m.find("zz"), m.end());
  EXPECT_THROW(m.at("zz"), c10::Error);
  OrderedMap<std::string, int> copy = m;
  EXPECT_TRUE(copy == m);
  EXPECT_EQ(copy.find("k7")->second, 7);
  OrderedMap<std::string, int> x{{"a", 1}, {"b", 2}}, y{{"b", 2}, {"a", 1}}, z{{"a", 1}};
  EXPECT_TRUE(x == y);   // order does not matter for equality
  EXPECT_FALSE(x == z);
  z = x;
  EXPECT_TRUE(z == x);
  EXPECT_EQ(z.count("b"), 1u);
}

// FlatMap (storage_data's container) against std::map, the type it replaced: the same
// operations in a scrambled key order must leave the same entries in the same order. The
// values are heap-allocated strings, and the map spans several of its blocks (512 entries of
// this size each), so moves across blocks and the entries' destruction are exercised.
TEST(FlatMapTest, BehavesLikeStdMapUnderAnyOrderOfOperations) {
  using Map = FlatMap<int, std::string>;
  Map flat;
  std::map<int, std::string> oracle;
  uint32_t x = 12345;
  auto next = [&] { return x = x * 1103515245u + 12345u; };
  for (int step = 0; step < 20000; ++step) {
    const int key = static_cast<int>((next() >> 12) % 5000);
    const std::string value = "a value too long to be kept inline " + std::to_string(next() >> 16);
    switch (next() >> 29) {
      case 0:
      case 1: {
        auto [it, inserted] = flat.emplace(key, value);
        auto [want, want_inserted] = oracle.emplace(key, value);
        ASSERT_EQ(inserted, want_inserted);
        ASSERT_EQ(it->first, key);
        ASSERT_EQ(it->second, want->second);
        break;
      }
      case 2:
        flat.insert_or_assign(key, value);
        oracle.insert_or_assign(key, value);
        break;
      case 3:
        flat[key] += value;
        oracle[key] += value;
        break;
      case 4:
        ASSERT_EQ(flat.erase(key), oracle.erase(key));
        break;
      case 5:
        flat.emplace_hint(flat.end(), key, value);
        oracle.emplace_hint(oracle.end(), key, value);
        break;
      default: {
        auto it = flat.find(key);
        ASSERT_EQ(it == flat.end(), oracle.count(key) == 0);
        if (it != flat.end()) {
          ASSERT_EQ(it->second, oracle.at(key));
          ASSERT_EQ(flat.at(key), oracle.at(key));
        } else {
          ASSERT_THROW(flat.at(key), c10::IndexError);
        }
        const auto lb = flat.lower_bound(key);
        const auto want = oracle.lower_bound(key);
        ASSERT_EQ(lb == flat.end(), want == oracle.end());
        if (want != oracle.end()) ASSERT_EQ(lb->first, want->first);
      }
    }
    ASSERT_EQ(flat.size(), oracle.size());
  }
  ASSERT_GT(flat.size(), 2000u);
  // FlatMap's entries are pair<K, V>, std::map's pair<const K, V>.
  auto equal_entry = [](const auto& a, const auto& b) {
    return a.first == b.first && a.second == b.second;
  };
  auto same = [&](const Map& m) {
    return std::equal(m.begin(), m.end(), oracle.begin(), oracle.end(), equal_entry);
  };
  ASSERT_TRUE(same(flat));
  // Copies, moves and appends.
  Map copy = flat;
  EXPECT_TRUE(copy == flat);
  Map moved = std::move(copy);
  EXPECT_TRUE(same(moved));
  EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): a moved-from map is empty
  int key = 6000;
  std::string value = "appended";
  EXPECT_TRUE(moved.append(std::move(key), std::move(value)));
  key = 10;
  value = "not after the last key";
  EXPECT_FALSE(moved.append(std::move(key), std::move(value)));
  EXPECT_EQ(value, "not after the last key");  // left as it was
  EXPECT_EQ(moved.size(), flat.size() + 1);
  // from_sorted adopts sorted, unique entries and refuses any others.
  auto entries = Map(flat).release();  // a copy's: `flat` is compared below
  EXPECT_TRUE(Map::from_sorted(entries) == flat);
  std::swap(entries[0], entries[1]);
  EXPECT_THROW(Map::from_sorted(entries), c10::Error);
  entries[1] = entries[0];
  EXPECT_THROW(Map::from_sorted(entries), c10::Error);
  EXPECT_TRUE((Map{{2, "b"}, {1, "a"}} == Map{{1, "a"}, {2, "b"}}));
  // from_unsorted takes any order; of equal keys the last wins, as insert_or_assign.
  std::vector<Map::value_type> scrambled;
  std::map<int, std::string> last_wins;
  for (int i = 0; i < 3000; ++i) {
    const int k = static_cast<int>((next() >> 12) % 1000);
    scrambled.emplace_back(k, "entry " + std::to_string(i));
    last_wins.insert_or_assign(k, "entry " + std::to_string(i));
  }
  const Map sorted = Map::from_unsorted(scrambled);
  ASSERT_EQ(sorted.size(), last_wins.size());
  EXPECT_TRUE(
      std::equal(sorted.begin(), sorted.end(), last_wins.begin(), last_wins.end(), equal_entry));
  flat.clear();
  EXPECT_TRUE(flat.empty());
  EXPECT_EQ(flat.begin(), flat.end());
}

TEST(GlobalPlanTest, OverlappingOutOfBoundsAndUncoveredChunksAreRejected) {
  expect_invalid(two_plans(tensor_item("w", {0}, {3}, {4}),
                           tensor_item("w", {2}, {2}, {4})),
                 "overlap");
  expect_invalid(two_plans(tensor_item("w", {0}, {2}, {4}),
                           tensor_item("w", {2}, {3}, {4})),
                 "leaves the tensor");
  expect_invalid(two_plans(tensor_item("w", {0}, {1}, {4}),
                           tensor_item("w", {2}, {2}, {4})),
                 "cover 3 of 4");
}

TEST(GlobalPlanTest, MergesPlannerDataFirstRankWinsAndRejectsKindConflicts) {
  std::vector<SavePlan> plans(3);
  plans[0].planner_data = {{"b", ObjectPath{Key("b")}}, {"d", ObjectPath{Key("d0")}}};
  plans[1].planner_data = {{"a", ObjectPath{Key("a")}}, {"d", ObjectPath{Key("d1")}},
                           {"e", ObjectPath{Key("e")}}};
  plans[2].planner_data = {{"c", ObjectPath{Key("c")}}, {"f", ObjectPath{Key("f")}}};
  auto [final_plans, md] = detail::create_default_global_save_plan(plans);
  ASSERT_TRUE(md.planner_data.has_value());
  std::vector<std::string> keys;
  for (const auto& [k, v] : *md.planner_data) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b", "c", "d", "e", "f"}));
  EXPECT_EQ(md.planner_data->at("d"), ObjectPath{Key("d0")});

  expect_invalid(two_plans(bytes_item("step"),
                           bytes_item("step")),
                 "'step' is saved twice");
  expect_invalid(two_plans(bytes_item("w"),
                           tensor_item("w", {0}, {4}, {4})),
                 "both as a tensor and as a non-tensor value");
  expect_invalid(two_plans(tensor_item("w", {0}, {2}, {4}),
                           tensor_item("w", {2}, {2}, {5})),
                 "ranks disagree on the shape");
}

// SavePlan::planner_data is a map shared between copies until one is changed: a change
// through any call that can make one is never seen through another copy.
TEST(PlannerDataTest, CopiesShareOneMapUntilOneChangesIt) {
  const PlannerData empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.begin(), empty.end());
  EXPECT_EQ(empty.count("a"), 0u);
  EXPECT_THROW(empty.at("a"), std::out_of_range);
  EXPECT_FALSE(empty.shares_with(PlannerData()));

  const PlannerData original = {{"a", ObjectPath{Key("a")}}, {"b", ObjectPath{Key("b"), 1}}};
  const PlannerData::Map expected = original.map();
  // Each way of changing a copy leaves `original` as it was.
  const std::vector<std::function<void(PlannerData&)>> changes = {
      [](PlannerData& p) { p.emplace("c", ObjectPath{Key("c")}); },
      [](PlannerData& p) { p.insert_or_assign("a", ObjectPath{Key("x")}); },
      [](PlannerData& p) { p["b"].push_back(Key("y")); },
      [](PlannerData& p) { EXPECT_EQ(p.erase("a"), 1u); },
      [](PlannerData& p) { p.clear(); },
      [](PlannerData& p) { p.mutable_map().begin()->second.clear(); },
  };
  for (size_t k = 0; k < changes.size(); ++k) {
    SCOPED_TRACE(k);
    PlannerData copy = original;
    EXPECT_TRUE(copy.shares_with(original));
    EXPECT_TRUE(copy == original);
    changes[k](copy);
    EXPECT_FALSE(copy.shares_with(original));
    EXPECT_TRUE(copy != original);
    EXPECT_TRUE(original.map() == expected);
  }
  // An unshared map is changed in place; equal maps that are not shared compare equal.
  PlannerData own = PlannerData::Map(expected);
  const auto* before = &own.map();
  own.emplace("c", ObjectPath{Key("c")});
  EXPECT_EQ(&own.map(), before);
  EXPECT_EQ(own.size(), 3u);
  own.erase("c");
  EXPECT_TRUE(own == original);
  EXPECT_FALSE(own.shares_with(original));
}

// DefaultSavePlanner's local plans carry its state dict's mappings without copying them: the
// plans of two saves share one map, which holds every flat key's path. A plan changed by its
// writer or a subclass gets its own map and leaves the planner's as it was.
TEST(PlannerDataTest, LocalPlansShareThePlannersMappings) {
  StateDict sd;
  sd["w"] = at::ones({2});
  Dict inner;
  inner["step"] = int64_t{3};
  sd["opt"] = inner;
  DefaultSavePlanner planner;
  planner.set_up_planner(sd, std::nullopt, /*is_coordinator=*/true);
  SavePlan first = planner.create_local_plan();
  const SavePlan second = planner.create_local_plan();
  EXPECT_TRUE(first.planner_data.shares_with(second.planner_data));
  const PlannerData::Map expected = {{"w", ObjectPath{Key("w")}},
                                     {"opt.step", ObjectPath{Key("opt"), Key("step")}}};
  EXPECT_TRUE(second.planner_data.map() == expected);
  first.planner_data.emplace("extra", ObjectPath{Key("extra")});
  EXPECT_FALSE(first.planner_data.shares_with(second.planner_data));
  EXPECT_TRUE(planner.create_local_plan().planner_data.map() == expected);
}

// Note [Shared planner_data]: the coordinator's plans share the planner_data of ranks that send
// the same one; the decoded plans and the global plan are what they are without the sharing.
TEST(PlannerDataTest, DecodedPlansShareEqualPlannerDataAndPlanAsWithoutSharing) {
  auto plan_of = [](int rank, const std::string& extra) {
    SavePlan plan;
    plan.items = {tensor_item("w", {2 * rank}, {2}, {8}),
                  bytes_item("step_" + std::to_string(rank))};
    plan.planner_data = {{"w", ObjectPath{Key("w")}}, {"step", ObjectPath{Key("step"), 0}}};
    if (!extra.empty()) plan.planner_data.emplace(extra, ObjectPath{Key(extra)});
    plan.storage_data = "__" + std::to_string(rank) + "_";
    return plan;
  };
  // Ranks 0 and 1 send the same mappings, rank 2 one more key, rank 3 rank 2's again.
  const std::vector<SavePlan> sent = {plan_of(0, ""), plan_of(1, ""), plan_of(2, "z"),
                                      plan_of(3, "z")};
  std::vector<std::string> encoded;
  for (const auto& p : sent) encoded.push_back(detail::encode_save_plan(p));
  std::vector<SavePlan> shared = detail::decode_save_plans(encoded);
  std::vector<SavePlan> alone;
  for (const auto& e : encoded) alone.push_back(detail::decode_save_plan(e));
  ASSERT_EQ(shared.size(), 4u);
  EXPECT_TRUE(shared[1].planner_data.shares_with(shared[0].planner_data));
  EXPECT_FALSE(shared[2].planner_data.shares_with(shared[1].planner_data));
  EXPECT_TRUE(shared[3].planner_data.shares_with(shared[2].planner_data));
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_FALSE(alone[r].planner_data.shares_with(shared[r].planner_data));
    EXPECT_TRUE(detail::compare_save_plans(shared[r], alone[r])) << r;
    EXPECT_TRUE(shared[r].planner_data == sent[r].planner_data) << r;
    EXPECT_EQ(shared[r].storage_data, sent[r].storage_data);
  }
  // Encoded together, plans that share a map reuse its bytes: the same bytes as alone.
  EXPECT_EQ(detail::encode_save_plans(shared), encoded);
  EXPECT_EQ(detail::encode_save_plans(alone), encoded);
  auto [plans_shared, md_shared] = detail::create_default_global_save_plan(shared);
  auto [plans_alone, md_alone] = detail::create_default_global_save_plan(alone);
  EXPECT_TRUE(md_shared == md_alone);
  ASSERT_TRUE(md_shared.planner_data.has_value());
  EXPECT_EQ(md_shared.planner_data->size(), 3u);
  EXPECT_EQ(md_shared.planner_data->count("z"), 1u);
  // A planner that changes one rank's planner_data changes only that rank's.
  shared[1].planner_data.emplace("only_1", ObjectPath{Key("only_1")});
  EXPECT_EQ(shared[0].planner_data.count("only_1"), 0u);
  EXPECT_EQ(shared[1].planner_data.count("only_1"), 1u);
}

TEST(GlobalPlanTest, ShardsListedOutOfOffsetOrderAreDeduplicatedAndValidated) {
  // Ranks hold a tensor's shards in reverse order, the names in rotated order, and rank 3
  // repeats rank 0's shard: the sorts that usually find their input in order must run.
  std::vector<SavePlan> plans(4);
  const std::vector<std::string> names{"x", "y", "z"};
  for (int r = 0; r < 4; ++r) {
    const int64_t row = r < 3 ? 2 - r : 2;
    for (int k = 0; k < 3; ++k) {
      plans[r].items.push_back(tensor_item(names[(r + k) % 3], {row, 0}, {1, 2}, {3, 2}));
    }
  }
  auto deduped = detail::dedup_save_plans(plans, true);
  EXPECT_EQ(deduped[0].items.size(), 3u);
  EXPECT_TRUE(deduped[3].items.empty());  // rank 0 (the lowest) keeps the repeated shard
  auto [final_plans, md] = detail::create_default_global_save_plan(deduped);
  for (const auto& name : names) {
    const auto& t = std::get<TensorStorageMetadata>(md.state_dict_metadata.at(name));
    ASSERT_EQ(t.chunks.size(), 3u) << name;
    EXPECT_EQ(t.chunks[0].offsets[0], 2) << name;  // rank order, not offset order
  }
  plans[3].items[0] = tensor_item("y", {1, 1}, {1, 1}, {3, 2});  // overlaps rank 1's row
  std::vector<SavePlan> overlapping = detail::dedup_save_plans(plans, true);
  EXPECT_THROW(detail::create_default_global_save_plan(overlapping), c10::ValueError);
}

TEST(NameInternerTest, IdsInFirstSeenOrderForRunsCyclesAndJumps) {
  const std::vector<std::string> pool{"a", "bb", "a2", "c", "bb2", ""};
  detail::NameInterner interner;
  std::map<std::string, uint32_t> expected;
  auto check = [&](const std::string& name) {
    auto [it, inserted] = expected.try_emplace(name, static_cast<uint32_t>(expected.size()));
    auto [id, fresh] = interner.intern(name);
    EXPECT_EQ(id, it->second) << name;
    EXPECT_EQ(fresh, inserted) << name;
  };
  for (int cycle = 0; cycle < 3; ++cycle) {
    for (const auto& n : pool) check(n);  // cycles: the "next" guess
  }
  for (const auto& n : pool) {
    for (int k = 0; k < 3; ++k) check(n);  // runs: the "same" guess
  }
  for (size_t k = 0; k < 50; ++k) check(pool[(k * 7 + k / 3) % pool.size()]);  // jumps
  check("new");
  check("a");
  EXPECT_EQ(interner.names().size(), pool.size() + 1);
}

TEST(ReshardingTest, ReadsAreTheOverlapBoxes) {
  TensorStorageMetadata saved;
  saved.size = {10, 4};
  saved.chunks = {{{0, 0}, {3, 4}}, {{3, 0}, {3, 4}}, {{6, 0}, {3, 4}}, {{9, 0}, {1, 4}}};
  // Destination rows [4, 8) (a 3-rank split's middle piece of 10 rows is [4, 8)).
  auto reads = detail::create_read_items_for_chunk_list("w", saved, {{{4, 0}, {4, 4}}});
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].storage_index.offset, (Dims{3, 0}));
  EXPECT_EQ(reads[0].storage_offsets, (Dims{1, 0}));
  EXPECT_EQ(reads[0].dest_offsets, (Dims{0, 0}));
  EXPECT_EQ(reads[0].lengths, (Dims{2, 4}));
  EXPECT_EQ(reads[1].storage_offsets, (Dims{0, 0}));
  EXPECT_EQ(reads[1].dest_offsets, (Dims{2, 0}));
  EXPECT_EQ(reads[1].lengths, (Dims{2, 4}));
  // Empty destination chunks read nothing; 0-d tensors always read once.
  EXPECT_TRUE(detail::create_read_items_for_chunk_list("w", saved, {{{10, 0}, {0, 4}}}).empty());
  TensorStorageMetadata scalar;
  scalar.chunks = {{{}, {}}};
  EXPECT_EQ(detail::create_read_items_for_chunk_list("s", scalar, {{{}, {}}}).size(), 1u);
}

TEST(NearestKeyTest, FindsRenamesAndTypos) {
  const std::vector<std::string> keys = {"module.encoder.weight", "decoder.bias", "step"};
  EXPECT_EQ(detail::nearest_key("encoder.weight", keys), "module.encoder.weight");
  EXPECT_EQ(detail::nearest_key("decoder.bais", keys), "decoder.bias");
  EXPECT_EQ(detail::nearest_key("completely_unrelated_name", keys), "");
}

Metadata one_tensor_metadata(std::vector<int64_t> shape, c10::ScalarType dtype) {
  Metadata md;
  TensorStorageMetadata t;
  t.properties.dtype = dtype;
  t.size = shape;
  t.chunks = {{Dims(shape.size(), 0), Dims(shape)}};
  md.state_dict_metadata["model.weight"] = t;
  return md;
}

TEST(DefaultLoadPlannerTest, MissingKeyNamesTheNearestSavedKey) {
  Metadata md = one_tensor_metadata({2, 2}, c10::ScalarType::Float);
  StateDict sd;
  sd["model"] = Dict{{std::string("weigth"), Value(at::zeros({2, 2}))}};
  DefaultLoadPlanner planner;
  planner.set_up_planner(sd, md, true);
  try {
    planner.create_local_plan();
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'model.weigth'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'model.weight'"), std::string::npos) << msg;
  }
  DefaultLoadPlannerOptions partial;
  partial.allow_partial_load = true;
  DefaultLoadPlanner lenient(partial);
  lenient.set_up_planner(sd, md, true);
  EXPECT_TRUE(lenient.create_local_plan().items.empty());
}

TEST(DefaultLoadPlannerTest, ShapeAndDtypeMismatchesAreErrors) {
  Metadata md = one_tensor_metadata({2, 2}, c10::ScalarType::BFloat16);
  StateDict wrong_shape;
  wrong_shape["model"] = Dict{{std::string("weight"), Value(at::zeros({2, 3}, at::kBFloat16))}};
  DefaultLoadPlanner p1;
  p1.set_up_planner(wrong_shape, md, true);
  EXPECT_THROW(p1.create_local_plan(), c10::ValueError);

  StateDict wrong_dtype;
  wrong_dtype["model"] = Dict{{std::string("weight"), Value(at::zeros({2, 2}))}};
  DefaultLoadPlanner p2;
  p2.set_up_planner(wrong_dtype, md, true);
  try {
    p2.create_local_plan();
    FAIL() << "no error";
  } catch (const c10::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
  DefaultLoadPlannerOptions cast;
  cast.allow_dtype_cast = true;
  DefaultLoadPlanner p3(cast);
  p3.set_up_planner(wrong_dtype, md, true);
  EXPECT_EQ(p3.create_local_plan().items.size(), 1u);
}

}  // namespace
}  // namespace dcp
