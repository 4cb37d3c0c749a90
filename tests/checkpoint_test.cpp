// dcp::save / dcp::load on the file system: round trips of every supported value, in-place
// loading, and the protocol's guarantees.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "io/file.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

TEST(CheckpointTest, RoundTripOfTheReferenceStateDictIsBitwise) {
  testing::TempDir dir;
  const StateDict sd = testing::reference_state_dict();
  const Metadata md = save(sd, dir.sub("ckpt"));
  StateDict loaded = testing::blank_like(sd);
  load(loaded, dir.sub("ckpt"));
  const std::string diff = testing::describe_difference(Value(sd), Value(loaded));
  EXPECT_TRUE(diff.empty()) << diff;
  // The returned metadata is the committed one.
  FileSystemReader reader(dir.sub("ckpt"));
  EXPECT_TRUE(reader.read_metadata() == md);
  EXPECT_EQ(md.version, std::optional<std::string>("1.0.0"));
  EXPECT_EQ(md.planner_data->at("optim.param_groups.0.lr"),
            (ObjectPath{Key("optim"), Key("param_groups"), Key(int64_t{0}), Key("lr")}));
  EXPECT_EQ(md.state_dict_metadata.count("empty_dict"), 0u);
}

// Loading without a destination (Python's _EmptyStateDictLoadPlanner): the whole nested state
// comes back from the metadata alone, bit for bit; `keys` narrows it to some subtrees. As in
// Python, paths hold dict keys as strings: the optimizer's {0: state} comes back as
// {"0": state}.
TEST(CheckpointTest, EmptyStateDictLoadPlannerRebuildsTheWholeState) {
  testing::TempDir dir;
  StateDict sd = testing::reference_state_dict();
  sd.erase("empty_dict");  // saves nothing, so nothing comes back
  save(sd, dir.sub("ckpt"));
  StateDict loaded;
  LoadOptions options;
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>();
  load(loaded, dir.sub("ckpt"), options);
  Dict& optim = sd.at("optim").dict();
  optim.at("state") = Dict{{Key("0"), optim.at("state").dict().at(Key(int64_t{0}))}};
  const std::string diff = testing::describe_difference(Value(sd), Value(loaded));
  EXPECT_TRUE(diff.empty()) << diff;

  StateDict some;
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>(std::vector<std::string>{"optim"});
  load(some, dir.sub("ckpt"), options);
  ASSERT_EQ(some.size(), 1u);
  EXPECT_TRUE(testing::describe_difference(sd.at("optim"), some.at("optim")).empty());

  StateDict none;
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>(std::vector<std::string>{"nope"});
  EXPECT_THROW(load(none, dir.sub("ckpt"), options), c10::ValueError);
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>();
  EXPECT_THROW(load(loaded, dir.sub("ckpt"), options), c10::ValueError);  // not empty
}

TEST(CheckpointTest, LoadFillsTensorsInPlaceAndReplacesOtherValues) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {4, 4}, 3);
  sd["step"] = 10;
  save(sd, dir.sub("c"));
  StateDict dest;
  at::Tensor target = at::zeros({4, 4});
  const void* storage = target.data_ptr();
  dest["w"] = target;
  dest["step"] = "placeholder";
  load(dest, dir.sub("c"));
  EXPECT_EQ(dest["w"].tensor().data_ptr(), storage);
  EXPECT_TRUE(at::equal(target, sd["w"].tensor()));
  EXPECT_EQ(dest["step"], Value(10));
}

// Parameters require grad. The reads write into them in place (a leaf that requires grad
// refuses in-place writes, so the planner writes through a detached view) and they stay leaves
// that require grad: whole tensors, a shard (rows 1-2 of 4, a narrowed destination) and a
// non-contiguous destination (a transposed view, filled by a copy).
TEST(CheckpointTest, LoadFillsTensorsThatRequireGradInPlace) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {4, 3}, 1);
  sd["s"] = testing::make_tensor(at::kFloat, {4, 3}, 2);
  sd["t"] = testing::make_tensor(at::kFloat, {3, 4}, 3);
  save(sd, dir.sub("c"));

  StateDict dest;
  at::Tensor w = at::zeros({4, 3}).requires_grad_(true);
  at::Tensor rows = at::zeros({2, 3}).requires_grad_(true);
  at::Tensor t_storage = at::zeros({4, 3});
  at::Tensor t = t_storage.t().requires_grad_(true);  // {3, 4}, not contiguous
  dest["w"] = w;
  dest["s"] = ShardedTensor({4, 3}, at::kFloat, {Shard{rows, {1, 0}}});
  dest["t"] = t;
  load(dest, dir.sub("c"));
  EXPECT_TRUE(at::equal(w.detach(), sd["w"].tensor()));
  EXPECT_TRUE(at::equal(rows.detach(), sd["s"].tensor().narrow(0, 1, 2)));
  EXPECT_TRUE(at::equal(t.detach(), sd["t"].tensor()));
  for (const at::Tensor& p : {w, rows, t}) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
}

// Saving reads tensors that require grad as they are (write_bucket writes a CPU tensor without
// autograd as it is and detaches the others): whole, a shard, and a transposed view (its record
// is a contiguous clone). What loads is bitwise the same, and the saved tensors are untouched.
TEST(CheckpointTest, SavesTensorsThatRequireGrad) {
  testing::TempDir dir;
  const at::Tensor w = testing::make_tensor(at::kFloat, {4, 3}, 1).requires_grad_(true);
  const at::Tensor rows = testing::make_tensor(at::kFloat, {2, 3}, 2).requires_grad_(true);
  const at::Tensor t = testing::make_tensor(at::kFloat, {4, 3}, 3).t().requires_grad_(true);
  StateDict sd;
  sd["w"] = w;
  sd["s"] = ShardedTensor({2, 3}, at::kFloat, {Shard{rows, {0, 0}}});
  sd["t"] = t;
  save(sd, dir.sub("c"));

  StateDict dest;
  dest["w"] = at::zeros({4, 3});
  dest["s"] = at::zeros({2, 3});
  dest["t"] = at::zeros({3, 4});
  load(dest, dir.sub("c"));
  EXPECT_TRUE(at::equal(dest["w"].tensor(), w.detach()));
  EXPECT_TRUE(at::equal(dest["s"].tensor(), rows.detach()));
  EXPECT_TRUE(at::equal(dest["t"].tensor(), t.detach()));
  for (const at::Tensor& p : {w, rows, t}) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
}

TEST(CheckpointTest, NewerDtypesUseTheV3Record) {
  testing::TempDir dir;
  StateDict sd;
  sd["u16"] = at::arange(10, at::kInt).to(at::kUInt16);
  sd["f8"] = testing::make_tensor(at::kFloat, {6}, 1).to(at::kFloat8_e4m3fn);
  sd["c64"] = at::complex(testing::make_tensor(at::kFloat, {3}, 1),
                          testing::make_tensor(at::kFloat, {3}, 2));
  save(sd, dir.sub("c"));
  StateDict dest = testing::blank_like(sd);
  load(dest, dir.sub("c"));
  for (const char* k : {"u16", "f8", "c64"}) {
    EXPECT_TRUE(at::equal(dest[k].tensor().view(at::kByte), sd[k].tensor().view(at::kByte)))
        << k;
  }
}

TEST(CheckpointTest, OverwriteFalseRefusesAnExistingCheckpoint) {
  testing::TempDir dir;
  StateDict sd;
  sd["a"] = 1;
  save(sd, dir.sub("c"));
  FileSystemWriterOptions o;
  o.overwrite = false;
  FileSystemWriter writer(dir.sub("c"), o);
  try {
    save(sd, writer);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
}

TEST(CheckpointTest, DataFilesWithoutMetadataAreReportedAsIncomplete) {
  testing::TempDir dir;
  StateDict sd;
  sd["a"] = at::ones({2});
  save(sd, dir.sub("c"));
  detail::remove_file(dir.sub("c") + "/.metadata");
  try {
    load(sd, dir.sub("c"));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete checkpoint"), std::string::npos) << e.what();
  }
}

TEST(CheckpointTest, ErrorsNameTheRankAndTheCheckpoint) {
  testing::TempDir dir;
  StateDict sd;
  sd["a"] = at::ones({2});
  save(sd, dir.sub("c"));
  StateDict dest;
  dest["b"] = at::ones({2});
  try {
    load(dest, dir.sub("c"));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir.sub("c")), std::string::npos) << msg;
    EXPECT_NE(msg.find("Missing key"), std::string::npos) << msg;
  }
}

TEST(CheckpointTest, CorruptRecordBytesAreReportedNotCrashed) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {32}, 1);
  sd["s"] = "value";
  save(sd, dir.sub("c"));
  const std::string path = dir.sub("c") + "/__0_0.distcp";
  const std::string original = detail::read_file(path);
  for (size_t i = 0; i < original.size(); i += 37) {
    std::string corrupt = original;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0xff);
    {
      detail::File f = detail::File::open(path, O_WRONLY | O_TRUNC);
      f.write_all(corrupt.data(), corrupt.size());
    }
    StateDict dest = testing::blank_like(sd);
    try {
      load(dest, dir.sub("c"));
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("__0_0.distcp"), std::string::npos) << e.what();
    }
  }
}

// Error context, end to end (docs/design.md, Errors): storage adds the item, file and byte
// range; the protocol adds the rank and the checkpoint, once; the exception keeps its type.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ErrorContextTest, AReadErrorNamesTheFileAndRangeAndTheRankOnce) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {64}, 1);
  const Metadata md = save(sd, dir.sub("c"));
  const StorageInfo& info = md.storage_data.begin()->second;
  // Cut the file inside the record's data.
  std::filesystem::resize_file(dir.sub("c") + "/" + info.relative_path, info.offset + info.length - 100);
  StateDict dest = testing::blank_like(sd);
  try {
    load(dest, dir.sub("c"));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    const std::string range = "reading 'w' from '" + info.relative_path + "' [" +
                              std::to_string(info.offset) + ", " +
                              std::to_string(info.offset + info.length) + ")";
    EXPECT_EQ(count(msg, range), 1u) << msg;
    EXPECT_EQ(count(msg, "rank 0: loading checkpoint '" + dir.sub("c") + "'"), 1u) << msg;
    EXPECT_EQ(count(msg, "rank 0"), 1u) << msg;
  }
}

// A planner whose resolve_data raises a ValueError for one key.
class RefusingPlanner : public DefaultSavePlanner {
 public:
  WritePayload resolve_data(const WriteItem& item) override {
    TORCH_CHECK_VALUE(item.index.fqn != "bad", "refusing '", item.index.fqn, "'");
    return DefaultSavePlanner::resolve_data(item);
  }
};

TEST(ErrorContextTest, AWriteErrorKeepsItsTypeAndNamesTheFileAndOffset) {
  testing::TempDir dir;
  StateDict sd;
  sd["a"] = at::ones({4});
  sd["bad"] = at::ones({8});
  SaveOptions options;
  options.planner = std::make_shared<RefusingPlanner>();
  try {
    save(sd, dir.sub("c"), options);
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {  // not flattened into a plain c10::Error
    const std::string msg = e.what_without_backtrace();
    EXPECT_EQ(count(msg, "refusing 'bad'"), 1u) << msg;
    EXPECT_EQ(count(msg, "writing 'bad' to '__0_0.distcp' at byte "), 1u) << msg;
    EXPECT_EQ(count(msg, "rank 0: saving checkpoint '" + dir.sub("c") + "'"), 1u) << msg;
    EXPECT_EQ(count(msg, "rank 0"), 1u) << msg;
  }
}

TEST(ErrorContextTest, PlannerErrorsKeepTheirTypeThroughLoad) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = at::ones({4});
  save(sd, dir.sub("c"));
  StateDict wrong_shape;
  wrong_shape["w"] = at::ones({5});
  EXPECT_THROW(load(wrong_shape, dir.sub("c")), c10::ValueError);
  StateDict wrong_dtype;
  wrong_dtype["w"] = at::ones({4}, at::kDouble);
  EXPECT_THROW(load(wrong_dtype, dir.sub("c")), c10::TypeError);
}

TEST(ErrorContextTest, OnManyRanksEachRankNamesItselfOnceAndTheFailingRankOnce) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {64}, 1);
  const Metadata md = save(sd, dir.sub("c"));
  const StorageInfo& info = md.storage_data.begin()->second;
  std::vector<std::string> messages(3);
  run_in_process(3, [&](Communicator& comm) {
    StateDict dest = testing::blank_like(sd);
    // Rank 1 alone reads from a reader whose data file is missing.
    FileSystemReader reader(comm.rank() == 1 ? dir.sub("c1") : dir.sub("c"));
    if (comm.rank() == 1) {
      std::filesystem::create_directories(dir.sub("c1"));
      std::filesystem::copy_file(dir.sub("c") + "/.metadata", dir.sub("c1") + "/.metadata");
    }
    LoadOptions options;
    options.comm = &comm;
    options.read_once = false;  // every rank reads 'w' itself (else one rank reads it for all)
    try {
      load(dest, reader, options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
  });
  for (int r = 0; r < 3; ++r) {
    const std::string& msg = messages[r];
    EXPECT_EQ(count(msg, "step 'read' failed on rank 1 of 3"), 1u) << msg;
    EXPECT_EQ(count(msg, "rank " + std::to_string(r) + ": loading checkpoint"), 1u) << msg;
    EXPECT_EQ(count(msg, "reading 'w' from '" + info.relative_path + "'"), 1u) << msg;
    EXPECT_EQ(count(msg, ": rank "), 0u) << msg;  // never "rank 1: rank 1:"
  }
}

// Python's protected hooks: subclasses change what is written (transform_object) and where
// reads land (lookup_tensor, transform_tensor).
class DoublingSavePlanner : public DefaultSavePlanner {
 protected:
  WritePayload transform_object(const WriteItem& item, WritePayload object) override {
    if (auto* t = std::get_if<at::Tensor>(&object)) return *t * 2;
    return object;
  }
};

class RedirectingLoadPlanner : public DefaultLoadPlanner {
 public:
  explicit RedirectingLoadPlanner(at::Tensor target) : target_(std::move(target)) {}
  std::atomic<int> transforms{0};

 protected:
  at::Tensor lookup_tensor(const MetadataIndex& index) const override {
    return index.fqn == "w" ? target_ : DefaultLoadPlanner::lookup_tensor(index);
  }
  at::Tensor transform_tensor(const ReadItem& item, const at::Tensor& tensor) override {
    ++transforms;
    return DefaultLoadPlanner::transform_tensor(item, tensor);
  }

 private:
  at::Tensor target_;
};

TEST(PlannerHooksTest, SubclassesTransformWhatIsWrittenAndRedirectWhatIsRead) {
  MemoryStorage storage;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {4, 3}, 1);
  sd["b"] = testing::make_tensor(at::kFloat, {3}, 2);
  sd["step"] = int64_t{5};
  MemoryWriter writer(storage, "c");
  SaveOptions save_options;
  save_options.planner = std::make_shared<DoublingSavePlanner>();
  save(sd, writer, save_options);

  StateDict dest = testing::blank_like(sd);
  const at::Tensor elsewhere = at::zeros({4, 3});
  auto planner = std::make_shared<RedirectingLoadPlanner>(elsewhere);
  LoadOptions load_options;
  load_options.planner = planner;
  MemoryReader reader(storage, "c");
  load(dest, reader, load_options);
  EXPECT_TRUE(at::equal(elsewhere, sd["w"].tensor() * 2));
  EXPECT_TRUE(at::equal(dest["w"].tensor(), at::zeros({4, 3})));  // redirected, untouched
  EXPECT_TRUE(at::equal(dest["b"].tensor(), sd["b"].tensor() * 2));
  EXPECT_EQ(dest["step"].get<int64_t>(), 5);
  EXPECT_EQ(planner->transforms.load(), 2);
}

TEST(AsyncSaveOptionsTest, AreSaveOptionsPlusAStager) {
  AsyncSaveOptions options;
  SaveOptions& base = options;  // every dcp::save option is an async_save option
  base.coordinator_rank = 0;
  base.planner = std::make_shared<DoublingSavePlanner>();
  MemoryStorage storage;
  StateDict sd;
  sd["w"] = at::ones({3});
  async_save(sd, std::make_shared<MemoryWriter>(storage, "c"), options).get();
  StateDict dest = testing::blank_like(sd);
  MemoryReader reader(storage, "c");
  load(dest, reader);
  EXPECT_TRUE(at::equal(dest["w"].tensor(), at::full({3}, 2.0f)));  // the planner was used
}

}  // namespace
}  // namespace dcp
