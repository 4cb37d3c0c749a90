// Flattening and set_element follow Python DCP's rules (docs/format.md §6.1).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "dcp/state_dict.h"

namespace dcp {
namespace {

std::vector<std::string> keys(const FlatStateDict& flat) {
  std::vector<std::string> out;
  for (const auto& [k, v] : flat.items) out.push_back(k);
  return out;
}

TEST(FlattenTest, DictsAreTraversedAndEmptyDictsVanish) {
  StateDict sd;
  sd["model"] = Dict{{std::string("w"), Value(at::ones({2}))},
                     {std::string("sub"), Value(Dict{{std::string("b"), Value(1)}})}};
  sd["empty"] = Dict{};
  auto flat = flatten_state_dict(sd);
  EXPECT_EQ(keys(flat), (std::vector<std::string>{"model.w", "model.sub.b"}));
  EXPECT_EQ(flat.mappings.at("model.sub.b"),
            (ObjectPath{Key("model"), Key("sub"), Key("b")}));
}

TEST(FlattenTest, ListsAreTraversedOnlyWhenTheyHoldTensorsOrDicts) {
  StateDict sd;
  sd["plain"] = List{Value(1), Value(2)};
  sd["nested_plain"] = List{Value(List{Value(1)})};
  sd["tensors"] = List{Value(at::ones({1})), Value(3)};
  sd["dicts"] = List{Value(Dict{{std::string("lr"), Value(0.1)}})};
  sd["deep"] = List{Value(List{Value(at::ones({1}))})};
  sd["empty"] = List{};
  auto flat = flatten_state_dict(sd);
  EXPECT_EQ(keys(flat), (std::vector<std::string>{"plain", "nested_plain", "tensors.0",
                                                  "tensors.1", "dicts.0.lr", "deep.0.0",
                                                  "empty"}));
  EXPECT_EQ(flat.mappings.at("dicts.0.lr"), (ObjectPath{Key("dicts"), Key(int64_t{0}), Key("lr")}));
}

TEST(FlattenTest, TuplesAreLeavesAndIntKeysBecomeStrings) {
  StateDict sd;
  sd["betas"] = Tuple{{0.9, at::ones({1})}};
  sd["state"] = Dict{{int64_t{3}, Value(Dict{{std::string("step"), Value(5)}})}};
  auto flat = flatten_state_dict(sd);
  EXPECT_EQ(keys(flat), (std::vector<std::string>{"betas", "state.3.step"}));
  EXPECT_EQ(flat.mappings.at("state.3.step"), (ObjectPath{Key("state"), Key("3"), Key("step")}));
}

TEST(FlattenTest, DuplicatedFlatKeyRaisesValueError) {
  StateDict sd;
  sd["a.b"] = 1;
  sd["a"] = Dict{{std::string("b"), Value(2)}};
  EXPECT_THROW(flatten_state_dict(sd), c10::ValueError);
}

TEST(FlattenTest, FlatTensorsShareStorageWithTheStateDict) {
  StateDict sd;
  sd["w"] = at::zeros({3});
  auto flat = flatten_state_dict(sd);
  flat.items[0].second.tensor().fill_(7);
  EXPECT_TRUE(at::equal(sd["w"].tensor(), at::full({3}, 7.0)));
}

TEST(SetElementTest, CreatesContainersAndKeepsIntKeys) {
  StateDict sd;
  sd["state"] = Dict{{int64_t{0}, Value(Dict{{std::string("step"), Value(1)}})}};
  set_element(sd, {Key("state"), Key("0"), Key("step")}, Value(9));
  EXPECT_EQ(sd["state"].dict().at(int64_t{0}).dict().at("step"), Value(9));
  set_element(sd, {Key("groups"), Key(int64_t{1}), Key("lr")}, Value(0.5));
  ASSERT_TRUE(sd["groups"].is_list());
  EXPECT_EQ(sd["groups"].list().size(), 2u);
  EXPECT_EQ(sd["groups"].list()[1].dict().at("lr"), Value(0.5));
}

TEST(ValueTest, EqualityComparesTensorsBitwiseAndTypes) {
  EXPECT_EQ(Value(at::arange(4)), Value(at::arange(4)));
  EXPECT_NE(Value(at::arange(4)), Value(at::arange(4).to(at::kInt)));
  EXPECT_NE(Value(1), Value(1.0));
  EXPECT_NE(Value(List{Value(1)}), Value(Tuple{{Value(1)}}));
  EXPECT_THROW(Value(1).get<std::string>(), c10::Error);
}

TEST(StridedShardTest, FsdpOverTensorParallelIsOneBoxPerRankAndOtherOrdersAreRefused) {
  // Rows 0..7: tensor parallelism (inner mesh dimension) shards first, FSDP (outer) then
  // shards each TP piece: (dp, tp) = (0,0) rows 0-1, (0,1) 4-5, (1,0) 2-3, (1,1) 6-7.
  const std::vector<Placement> fsdp_tp{Placement::StridedShard(0, 2), Placement::Shard(0)};
  const int64_t want[4] = {0, 4, 2, 6};
  at::Tensor full = at::arange(24).view({8, 3});
  for (int r = 0; r < 4; ++r) {
    const LocalBox box = compute_local_box({8, 3}, {2, 2}, mesh_coordinate({2, 2}, r), fsdp_tp);
    EXPECT_EQ(box.offsets, (std::vector<int64_t>{want[r], 0})) << r;
    EXPECT_EQ(box.sizes, (std::vector<int64_t>{2, 3})) << r;
    const ShardedTensor st = distribute_tensor(full, {2, 2}, r, fsdp_tp);
    EXPECT_TRUE(torch::equal(st.local_shards().at(0).tensor, full.narrow(0, want[r], 2)));
  }
  // The other order gives rank (0,0) rows {0, 2}: no box holds them.
  try {
    compute_local_box({8}, {2, 2}, {0, 0}, {Placement::Shard(0), Placement::StridedShard(0, 2)});
    FAIL() << "a non-contiguous layout was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in dimension 0: not one range"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dcp
