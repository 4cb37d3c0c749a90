// '.metadata' encoding and decoding: round trips, Python-shaped inputs, corrupt bytes, the two
// decoders (direct and object tree) against each other; and the wire message in which the
// coordinator broadcasts a Metadata to the other ranks.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <limits>
#include <tuple>

#include "format/metadata_codec.h"
#include "format/pickle.h"
#include "planner/planner_helpers.h"
#include "protocol/plan_codec.h"
#include "testing/codec_samples.h"
#include "util/wire.h"

namespace dcp::detail {
namespace {

using dcp::testing::sample_metadata;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

// Hand-written pickles of dataclasses, as Python writes them: NEWOBJ of the class, then BUILD
// with a dict of its fields (written between the two calls as key, value, ...).
void begin_dataclass(pickle::Writer& w, const char* module, const char* name) {
  w.global(module, name);
  w.empty_tuple();
  w.newobj();
  w.empty_dict();
  w.mark();
}
void end_dataclass(pickle::Writer& w) {
  w.setitems();
  w.build();
}

// TensorProperties as Python pickles it: NEWOBJ, then BUILD with the 5-tuple state (dtype,
// torch.strided, requires_grad False, memory format 0, pin_memory False).
void tensor_properties(pickle::Writer& w, const char* module, const char* dtype,
                       const char* memory_format_class) {
  w.global(module, "TensorProperties");
  w.empty_tuple();
  w.newobj();
  w.mark();
  w.global("torch", dtype);
  w.global("torch", "strided");
  w.boolean(false);
  w.global(module, memory_format_class);
  w.integer(0);
  w.tuple(1);
  w.reduce();
  w.boolean(false);
  w.tuple_from_mark();
  w.build();
}

// Decodes `bytes` with both decoders: the direct one must read them (where `direct` says so)
// and agree with the object tree's.
Metadata decode_both(const std::string& bytes, bool direct = true) {
  const Metadata tree = decode_metadata_tree(bytes.data(), bytes.size(), "test");
  const std::optional<Metadata> fast = decode_metadata_direct(bytes.data(), bytes.size());
  EXPECT_EQ(fast.has_value(), direct);
  if (fast) EXPECT_TRUE(*fast == tree);
  const Metadata chosen = decode_metadata(bytes.data(), bytes.size(), "test");
  EXPECT_TRUE(chosen == tree);
  return tree;
}

TEST(MetadataCodecTest, RoundTripKeepsEveryField) {
  const Metadata md = sample_metadata();
  const std::string bytes = encode_metadata(md);
  const Metadata back = decode_both(bytes);
  EXPECT_TRUE(back == md);
  // Byte items have no offset; 0-d tensors have an empty one: different keys.
  EXPECT_EQ(back.storage_data.count(MetadataIndex("step")), 1u);
  EXPECT_EQ(back.storage_data.count(MetadataIndex("scalar", std::vector<int64_t>{})), 1u);
  EXPECT_EQ(back.storage_data.count(MetadataIndex("scalar")), 0u);
  // Keys keep their order ("w", "scalar", "step": not sorted), as a Python dict would.
  std::vector<std::string> keys;
  for (const auto& entry : back.state_dict_metadata) keys.push_back(entry.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"w", "scalar", "step"}));
}

// The message dcp::load and dcp::save broadcast: every field, the entries' order (which
// Metadata's == ignores) and each MetadataIndex's index hint (which == ignores too); its size
// computed ahead, exactly.
TEST(MetadataCodecTest, BroadcastMessageKeepsEveryFieldTheOrderAndTheIndexHints) {
  Metadata md = sample_metadata();
  auto& w = std::get<TensorStorageMetadata>(md.state_dict_metadata["w"]);
  w.properties.layout = c10::Layout::Sparse;
  w.properties.memory_format = MemFormatEncoding::TORCH_CHANNELS_LAST;
  w.properties.pin_memory = true;
  md.state_dict_metadata["a_last"] = BytesStorageMetadata{};
  md.storage_data.begin()->second.transform_descriptors = {"zstd", "crc"};
  md.storage_meta->load_id = "load";
  md.storage_meta->modules = {"model", "optim"};

  const std::string message = encode_metadata_message(md);
  // Sized exactly before it is written (one buffer of that size, not a growing one).
  EXPECT_EQ(metadata_message_size(md), message.size());
  const Metadata back = decode_metadata_message(message);
  EXPECT_TRUE(back == md);
  std::vector<std::string> order, back_order;
  for (const auto& entry : md.state_dict_metadata) order.push_back(entry.first);
  for (const auto& entry : back.state_dict_metadata) back_order.push_back(entry.first);
  EXPECT_EQ(back_order, order);
  ASSERT_EQ(back.storage_data.size(), md.storage_data.size());
  for (auto a = md.storage_data.cbegin(), b = back.storage_data.cbegin();
       a != md.storage_data.end(); ++a, ++b) {
    EXPECT_EQ(b->first.index, a->first.index) << a->first;
  }

  // The optional fields absent.
  md.planner_data.reset();
  md.storage_meta.reset();
  md.version.reset();
  const std::string bare_message = encode_metadata_message(md);
  EXPECT_EQ(metadata_message_size(md), bare_message.size());
  const Metadata bare = decode_metadata_message(bare_message);
  EXPECT_TRUE(bare == md);
  EXPECT_FALSE(bare.planner_data.has_value());
  EXPECT_FALSE(bare.storage_meta.has_value());
  EXPECT_FALSE(bare.version.has_value());
}

TEST(MetadataCodecTest, TruncatedBroadcastMessageRaisesInsteadOfReadingPastIt) {
  const std::string bytes = encode_metadata_message(sample_metadata());
  for (size_t n : {size_t{0}, size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_THROW(decode_metadata_message(bytes.substr(0, n)), c10::Error) << n;
  }
  EXPECT_THROW(decode_metadata_message(bytes + "x"), c10::Error);
}

TEST(MetadataCodecTest, RecurringNamesAndFilesRoundTripAndAreWrittenOnce) {
  // Storage entries sorted by key repeat each name in a run, and the files in a cycle; here
  // also with gaps and jumps, and a file named like a planner_data key (already memoized).
  Metadata md = sample_metadata();
  for (int t = 0; t < 5; ++t) {
    const std::string fqn = "layers." + std::to_string(t) + ".w";
    for (int r = 0; r < 7; ++r) {
      if ((t + r) % 4 == 0) continue;
      const std::string file = t == 3 ? "step" : "__" + std::to_string((r * 3 + t) % 7) + "_0.distcp";
      md.storage_data[MetadataIndex(fqn, std::vector<int64_t>{r, 0}, r)] = {file, r * 10, 10, {}};
    }
  }
  const std::string bytes = encode_metadata(md);
  const Metadata back = decode_both(bytes);
  EXPECT_TRUE(back == md);
  auto count = [&](const std::string& text) {
    size_t n = 0;
    for (size_t at = bytes.find(text); at != std::string::npos; at = bytes.find(text, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("__3_0.distcp"), 1u);
  EXPECT_EQ(count("layers.2.w"), 1u);
}

TEST(MetadataCodecTest, UsesOnlyTheAllowedGlobals) {
  const std::string bytes = encode_metadata(sample_metadata());
  auto root = pickle::unpickle(bytes.data(), bytes.size(), "test");
  std::set<std::string> globals;
  std::function<void(const pickle::ObjectPtr&)> walk = [&](const pickle::ObjectPtr& o) {
    if (!o) return;
    if (o->kind == pickle::Kind::Global) globals.insert(std::string(o->str()) + "." + std::string(o->name()));
    for (const auto& i : o->items()) walk(i);
    walk(o->callable());
    walk(o->args());
    walk(o->state());
  };
  walk(root.root());
  const std::set<std::string> allowed = {
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
      "torch.Size",
      "torch.bfloat16",
      "torch.int64",
      "torch.strided"};
  EXPECT_EQ(globals, allowed);
}

TEST(MetadataCodecTest, EveryTruncationOrByteFlipRaisesACleanError) {
  const std::string bytes = encode_metadata(sample_metadata());
  for (size_t n = 0; n < bytes.size(); n += 7) {
    EXPECT_THROW(decode_metadata(bytes.data(), n, "'.metadata'"), c10::Error) << n;
    EXPECT_FALSE(decode_metadata_direct(bytes.data(), n).has_value()) << n;
  }
  // Flipping bytes must never crash; it either raises or yields some metadata, and what the
  // direct decoder reads, the tree decoder reads the same.
  for (size_t i = 0; i < bytes.size(); i += 3) {
    std::string corrupt = bytes;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
    const auto direct = decode_metadata_direct(corrupt.data(), corrupt.size());
    try {
      const Metadata tree = decode_metadata_tree(corrupt.data(), corrupt.size(), "'.metadata'");
      if (direct) EXPECT_TRUE(*direct == tree) << i;
    } catch (const c10::Error& e) {
      EXPECT_FALSE(direct.has_value()) << i;
      EXPECT_NE(std::string(e.what()).find(".metadata"), std::string::npos);
    }
  }
}

TEST(MetadataCodecTest, RejectsForeignGlobalsWhereMetadataIsExpected) {
  pickle::Writer w;
  w.global("os", "system");
  w.str("echo hi");
  w.tuple(1);
  w.reduce();
  const std::string bytes = w.finish();
  try {
    decode_metadata(bytes.data(), bytes.size(), "'.metadata'");
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("os.system"), std::string::npos) << e.what();
  }
}

TEST(MetadataCodecTest, AcceptsLegacyTensorPropertiesAndMissingOptionalFields) {
  pickle::Writer w;
  begin_dataclass(w, kMetadataModule, "Metadata");
  w.str("state_dict_metadata");
  w.empty_dict();
  w.mark();
  w.str("t");
  begin_dataclass(w, kMetadataModule, "TensorStorageMetadata");
  w.str("properties");
  tensor_properties(w, "torch.distributed._shard.sharded_tensor.metadata", "float",  // an alias
                    "MEM_FORMAT_ENCODING");
  w.str("size");
  w.global("torch", "Size");
  w.integer(2);
  w.tuple(1);
  w.tuple(1);
  w.reduce();
  w.str("chunks");
  w.empty_list();
  end_dataclass(w);
  w.setitems();
  end_dataclass(w);
  const std::string bytes = w.finish();
  Metadata md = decode_both(bytes);
  const auto& t = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("t"));
  EXPECT_EQ(t.properties.dtype, c10::ScalarType::Float);
  EXPECT_EQ(t.size, Dims{2});
  EXPECT_FALSE(md.storage_meta.has_value());
  EXPECT_FALSE(md.version.has_value());
}

// A '.metadata' pickle with no tensors and these storage_data entries, in this order (as
// Python writes them: rank by rank, not in key order).
struct Entry {
  std::string fqn;
  int64_t offset;  // the chunk offset's one dimension
  int64_t length;
};
std::string storage_data_pickle(const std::vector<Entry>& entries) {
  pickle::Writer w;
  begin_dataclass(w, kMetadataModule, "Metadata");
  w.str("state_dict_metadata");
  w.empty_dict();
  w.str("storage_data");
  w.empty_dict();
  w.mark();
  for (const Entry& e : entries) {
    begin_dataclass(w, kMetadataModule, "MetadataIndex");
    w.str("fqn");
    w.str(e.fqn);
    w.str("offset");
    w.global("torch", "Size");
    w.integer(e.offset);
    w.tuple(1);
    w.tuple(1);
    w.reduce();
    end_dataclass(w);
    begin_dataclass(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    w.str("relative_path");
    w.str("__0_0.distcp");
    w.str("offset");
    w.integer(0);
    w.str("length");
    w.integer(e.length);
    end_dataclass(w);
  }
  w.setitems();
  end_dataclass(w);
  return w.finish();
}

TEST(MetadataCodecTest, StorageDataInAnyOrderDecodesToTheSameMapAndTheLastDuplicateWins) {
  const std::vector<std::vector<Entry>> orders = {
      {{"a", 0, 1}, {"a", 4, 2}, {"b", 0, 3}},                    // key order (dcp writes this)
      {{"b", 0, 3}, {"a", 4, 2}, {"a", 0, 1}},                    // descending from the start
      {{"a", 0, 1}, {"a", 4, 2}, {"b", 0, 9}, {"a", 2, 7}, {"b", 0, 3}},  // late, with a dup
      {{"a", 0, 1}, {"a", 4, 2}, {"b", 0, 9}, {"b", 0, 3}},  // ascending but for a dup
  };
  std::vector<std::vector<std::tuple<std::string, int64_t, int64_t>>> decoded;
  for (const auto& order : orders) {
    const std::string bytes = storage_data_pickle(order);
    const Metadata md = decode_both(bytes);
    decoded.emplace_back();
    for (const auto& [index, info] : md.storage_data) {
      ASSERT_TRUE(index.offset.has_value());
      decoded.back().emplace_back(index.fqn, index.offset->at(0), info.length);
    }
  }
  using Row = std::tuple<std::string, int64_t, int64_t>;
  EXPECT_EQ(decoded[0], (std::vector<Row>{{"a", 0, 1}, {"a", 4, 2}, {"b", 0, 3}}));
  EXPECT_EQ(decoded[1], decoded[0]);
  EXPECT_EQ(decoded[2], (std::vector<Row>{{"a", 0, 1}, {"a", 2, 7}, {"a", 4, 2}, {"b", 0, 3}}));
  EXPECT_EQ(decoded[3], decoded[0]);
}

// ---------------------------------------------------------------------------------------------
// The direct decoder (format/metadata_direct.cpp) against the object tree's.

TEST(MetadataDirectDecoderTest, ReadsWhatDcpWritesInEveryVariant) {
  Metadata md = sample_metadata();
  md.storage_data.begin()->second.transform_descriptors = {"zstd", "crc"};
  md.storage_meta->load_id = "load";
  md.storage_meta->modules = {"model", "optim"};
  auto& w = std::get<TensorStorageMetadata>(md.state_dict_metadata["w"]);
  w.properties.memory_format = MemFormatEncoding::TORCH_CHANNELS_LAST;
  w.properties.pin_memory = true;
  // Past 256 memo keys (LONG_BINPUT/LONG_BINGET), negative and 64-bit ints, 5-d shapes.
  for (int t = 0; t < 300; ++t) {
    const std::string fqn = "layers." + std::to_string(t) + ".weight";
    TensorStorageMetadata big;
    big.size = {int64_t{1} << 40, 3, 1, 1, 70000};
    big.chunks = {{{0, 0, 0, 0, 0}, {int64_t{1} << 40, 3, 1, 1, 70000}}};
    md.state_dict_metadata[fqn] = big;
    md.storage_data[MetadataIndex(fqn, std::vector<int64_t>{0, 0, 0, 0, 0}, 0)] = {
        "__" + std::to_string(t) + "_0.distcp", int64_t{3} << 33, 1 << 20, {}};
    (*md.planner_data)[fqn] = {Key("layers"), Key(int64_t{-t}), Key("weight")};
  }
  EXPECT_TRUE(decode_both(encode_metadata(md)) == md);

  md.planner_data.reset();
  md.storage_meta.reset();
  md.version.reset();
  EXPECT_TRUE(decode_both(encode_metadata(md)) == md);

  Metadata empty;
  EXPECT_TRUE(decode_both(encode_metadata(empty)) == empty);
}

// Whether `dims` keeps its integers inside the object that holds it (no heap block).
bool inline_in(const Dims& dims, const void* owner, size_t owner_size) {
  const auto* p = reinterpret_cast<const char*>(dims.data());
  const auto* o = static_cast<const char*>(owner);
  return p >= o && p < o + owner_size;
}

// Every decoder builds a chunk's offsets and sizes, a shape and a MetadataIndex's offset of up to
// four dimensions inline (dcp::Dims): the coordinator's and a loading rank's costs at scale are
// their heap blocks (docs/performance.md, "Flat dimensions"). Five dimensions spill to the heap
// and still round-trip.
TEST(MetadataDirectDecoderTest, DimsOfUpToFourDimensionsAreDecodedInline) {
  Metadata md = sample_metadata();
  TensorStorageMetadata five;
  five.size = {2, 3, 1, 1, 7};
  five.chunks = {{{0, 0, 0, 0, 0}, {2, 3, 1, 1, 7}}};
  md.state_dict_metadata["five"] = five;
  md.storage_data[MetadataIndex("five", Dims{0, 0, 0, 0, 0}, 0)] = {"__0_0.distcp", 0, 168, {}};
  auto check = [&](const Metadata& back, const char* how) {
    SCOPED_TRACE(how);
    EXPECT_TRUE(back == md);
    for (const auto& [fqn, entry] : back.state_dict_metadata) {
      const auto* t = std::get_if<TensorStorageMetadata>(&entry);
      if (t == nullptr) continue;
      const bool small = t->size.size() <= 4;
      EXPECT_EQ(inline_in(t->size, t, sizeof(*t)), small) << fqn;
      for (const auto& c : t->chunks) {
        EXPECT_EQ(inline_in(c.offsets, &c, sizeof(c)), small) << fqn;
        EXPECT_EQ(inline_in(c.sizes, &c, sizeof(c)), small) << fqn;
      }
    }
    for (const auto& [index, info] : back.storage_data) {
      if (!index.offset) continue;
      EXPECT_EQ(inline_in(*index.offset, &index, sizeof(index)), index.offset->size() <= 4)
          << index;
    }
  };
  const std::string bytes = encode_metadata(md);
  check(decode_metadata_tree(bytes.data(), bytes.size(), "test"), "object tree");
  check(*decode_metadata_direct(bytes.data(), bytes.size()), "direct");
  check(decode_metadata_message(encode_metadata_message(md)), "broadcast message");

  SavePlan plan;
  WriteItem item;
  item.type = WriteItemType::SHARD;
  item.index = MetadataIndex("w", Dims{2, 0});
  item.tensor_data = TensorWriteData{{{2, 0}, {2, 3}}, TensorProperties{}, {4, 3}};
  plan.items.push_back(item);
  const SavePlan back = decode_save_plan(encode_save_plan(plan));
  ASSERT_EQ(back.items.size(), 1u);
  const WriteItem& got = back.items[0];
  EXPECT_EQ(got.index, item.index);
  EXPECT_EQ(got.tensor_data->chunk, item.tensor_data->chunk);
  EXPECT_EQ(got.tensor_data->size, item.tensor_data->size);
  EXPECT_TRUE(inline_in(*got.index.offset, &got, sizeof(got)));
  EXPECT_TRUE(inline_in(got.tensor_data->chunk.offsets, &got, sizeof(got)));
  EXPECT_TRUE(inline_in(got.tensor_data->size, &got, sizeof(got)));
}

// Python DCP's own '.metadata' files (tests/fuzz/corpus/metadata: protocol 4, every object
// memoized, frames, STACK_GLOBAL, layouts through _get_layout, pathlib checkpoint ids).
TEST(MetadataDirectDecoderTest, ReadsPythonDcpFilesAsTheTreeDecoderDoes) {
  const std::filesystem::path dir =
      std::filesystem::path(DCP_SOURCE_DIR) / "tests/fuzz/corpus/metadata";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(entry.path().string());
    const Metadata md = decode_both(bytes);
    EXPECT_FALSE(md.state_dict_metadata.empty());
    ++files;
  }
  EXPECT_GE(files, 3);
}

// Where the input leaves what dcp and Python write, the direct decoder gives up and the tree
// decoder decides: it reads these.
TEST(MetadataDirectDecoderTest, GivesUpWhereTheTreeDecoderDecides) {
  auto metadata_with = [](const std::function<void(pickle::Writer&)>& sdm_value) {
    pickle::Writer w;
    begin_dataclass(w, kMetadataModule, "Metadata");
    w.str("state_dict_metadata");
    sdm_value(w);
    end_dataclass(w);
    return w.finish();
  };
  // An OrderedDict where Python writes a dict.
  const std::string ordered = metadata_with([](pickle::Writer& w) {
    w.global("collections", "OrderedDict");
    w.empty_tuple();
    w.reduce();
    w.mark();
    w.str("step");
    w.global(kMetadataModule, "BytesStorageMetadata");
    w.empty_tuple();
    w.newobj();
    w.setitems();
  });
  EXPECT_EQ(decode_both(ordered, /*direct=*/false).state_dict_metadata.size(), 1u);
  // A field the dataclass does not have (the tree ignores it).
  const std::string unknown_field = metadata_with([](pickle::Writer& w) {
    w.empty_dict();
    w.mark();
    w.str("t");
    begin_dataclass(w, kMetadataModule, "TensorStorageMetadata");
    w.str("properties");
    tensor_properties(w, kMetadataModule, "float32", "_MEM_FORMAT_ENCODING");
    w.str("size");
    w.empty_tuple();
    w.str("chunks");
    w.empty_list();
    w.str("future_field");
    w.none();
    end_dataclass(w);
    w.setitems();
  });
  EXPECT_EQ(decode_both(unknown_field, /*direct=*/false).state_dict_metadata.size(), 1u);
}

// FRAME (a buffering hint from protocol 4 on) may sit between any two opcodes. The direct
// decoder skips it in protocol 4 and 5 pickles and gives up on one in an older pickle, which
// the tree decoder reads (it skips a FRAME wherever it is).
TEST(MetadataDirectDecoderTest, SkipsFramesFromProtocol4AndLeavesOlderOnesToTheTree) {
  const std::string plain = encode_metadata(sample_metadata());
  ASSERT_EQ(plain.substr(0, 2), std::string("\x80\x02"));
  const std::string frame = std::string("\x95") + std::string(8, '\0');
  // A frame after the PROTO opcode and one before the STOP.
  std::string framed = plain.substr(0, 2) + frame + plain.substr(2);
  framed.insert(framed.size() - 1, frame);
  EXPECT_TRUE(decode_both(framed, /*direct=*/false) == sample_metadata());
  framed[1] = '\x04';
  EXPECT_TRUE(decode_both(framed) == sample_metadata());
  // A frame cut short is corrupt for both.
  const std::string cut = framed.substr(0, 2) + frame.substr(0, 5);
  EXPECT_FALSE(decode_metadata_direct(cut.data(), cut.size()).has_value());
  EXPECT_THROW(decode_metadata(cut.data(), cut.size(), "'.metadata'"), c10::Error);
}

// Note [Expansion budget]: both decoders charge each copy of a memo-shared value alike, so a
// small file that names one long string many times is refused by both, and one that stays
// within the budget is read alike by both.
TEST(MetadataDirectDecoderTest, ChargesMemoSharedValuesAsTheTreeDecoderDoes) {
  auto shared_keys = [](int references) {
    pickle::Writer w;
    begin_dataclass(w, kMetadataModule, "Metadata");
    w.str("state_dict_metadata");
    w.empty_dict();
    w.mark();
    const auto key = w.str(std::string(60000, 'k'));
    const auto cls = w.global(kMetadataModule, "BytesStorageMetadata");
    w.empty_tuple();
    w.newobj();
    for (int k = 1; k < references; ++k) {
      w.get(key);
      w.get(cls);
      w.empty_tuple();
      w.newobj();
    }
    w.setitems();
    end_dataclass(w);
    return w.finish();
  };
  EXPECT_EQ(decode_both(shared_keys(100)).state_dict_metadata.size(), 1u);
  const std::string bomb = shared_keys(1000);  // 60 MB of keys from a 69 KB file
  EXPECT_FALSE(decode_metadata_direct(bomb.data(), bomb.size()).has_value());
  try {
    decode_metadata(bomb.data(), bomb.size(), "'.metadata'");
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expands to more than"), std::string::npos) << e.what();
  }
}

// The messages ranks exchange during a save or load (protocol/plan_codec.h), decoded field by
// field into the objects they build: every field of every kind of item comes back (a decoded
// object encodes to the same bytes, and the fields are checked), including dimensions that
// spill to the heap; and a message cut anywhere raises instead of reading past its end.
TEST(PlanCodecTest, EveryMessageRoundTripsEveryFieldAndRejectsEveryTruncation) {
  SavePlan plan = dcp::testing::sample_save_plan();
  plan.usable = false;
  const Dims five{1, 2, 3, 4, 5};
  ASSERT_EQ(plan.items[2].tensor_data->chunk.sizes, five);
  const std::string plan_bytes = encode_save_plan(plan);
  const SavePlan back = decode_save_plan(plan_bytes);
  EXPECT_TRUE(compare_save_plans(back, plan));
  EXPECT_EQ(back.items[1].index.index, std::optional<int64_t>(7));
  EXPECT_EQ(back.items[2].tensor_data->chunk.sizes, five);
  EXPECT_FALSE(back.items[0].tensor_data.has_value());
  EXPECT_FALSE(back.usable);
  EXPECT_EQ(encode_save_plan(back), plan_bytes);

  const std::vector<WriteResult> results = dcp::testing::sample_write_results();
  ASSERT_EQ(results.size(), 2u);
  const std::string result_bytes = encode_write_results(results);
  const std::vector<WriteResult> results_back = decode_write_results(result_bytes);
  ASSERT_EQ(results_back.size(), 2u);
  EXPECT_EQ(results_back[1].index, results[1].index);
  EXPECT_EQ(results_back[1].index.index, std::optional<int64_t>(7));
  EXPECT_EQ(results_back[1].size_in_bytes, 12);
  EXPECT_EQ(results_back[1].storage_data, results[1].storage_data);
  EXPECT_EQ(encode_write_results(results_back), result_bytes);

  const LoadPlan load = dcp::testing::sample_load_plan();
  const ReadItem read = dcp::testing::sample_read_item();
  const std::vector<SharedRead> shared{{1, 48, c10::ScalarType::Half, read}};
  const std::string load_bytes = encode_load_plan(load, shared);
  const auto [load_back, shared_back] = decode_load_plan_with_shared(load_bytes);
  ASSERT_EQ(load_back.items.size(), 3u);
  EXPECT_EQ(load_back.items[0].lengths, read.lengths);
  EXPECT_EQ(load_back.items[0].storage_index.index, std::optional<int64_t>(0));
  EXPECT_EQ(load_back.items[2].type, LoadItemType::BYTE_IO);
  ASSERT_EQ(shared_back.size(), 1u);
  EXPECT_EQ(shared_back[0].dtype, c10::ScalarType::Half);
  EXPECT_EQ(encode_load_plan(load_back, shared_back), load_bytes);
  EXPECT_EQ(encode_load_plan(decode_load_plan(encode_load_plan(load))), encode_load_plan(load));

  for (size_t n = 0; n < plan_bytes.size(); ++n) {
    EXPECT_THROW(decode_save_plan(plan_bytes.substr(0, n)), c10::Error) << n;
  }
  for (size_t n = 0; n < result_bytes.size(); ++n) {
    EXPECT_THROW(decode_write_results(result_bytes.substr(0, n)), c10::Error) << n;
  }
  for (size_t n = 0; n < load_bytes.size(); ++n) {
    EXPECT_THROW(decode_load_plan_with_shared(load_bytes.substr(0, n)), c10::Error) << n;
  }
}

// Note [Repeated names] (protocol/plan_codec.cpp): a storage entry of the broadcast Metadata
// whose fqn is the previous entry's, and a read item whose storage_index names its
// dest_index's fqn, leave the name out; names that differ (an empty one included) go whole;
// and a message whose first name is a repeat raises instead of inventing one.
TEST(PlanCodecTest, RepeatedNamesGoOnceAndARepeatWithNothingBeforeItRaises) {
  auto occurrences = [](const std::string& bytes, const std::string& name) {
    size_t n = 0;
    for (size_t at = bytes.find(name); at != std::string::npos; at = bytes.find(name, at + 1)) ++n;
    return n;
  };
  const std::string name = "layers.0.attention.wq.weight";
  Metadata md;
  TensorStorageMetadata t;
  t.size = {6, 2};
  for (int64_t r = 0; r < 3; ++r) {
    t.chunks.push_back({{2 * r, 0}, {2, 2}});
    md.storage_data[MetadataIndex(name, Dims{2 * r, 0}, r)] = {c10::str("__", r, "_0.distcp"), 0,
                                                               16, {}};
    md.storage_data[MetadataIndex("", Dims{2 * r, 0}, r)] = {c10::str("__", r, "_0.distcp"), 16,
                                                             16, {}};
  }
  md.state_dict_metadata[name] = t;
  md.state_dict_metadata[""] = t;
  md.storage_data[MetadataIndex("z")] = {"__0_0.distcp", 32, 4, {}};
  md.state_dict_metadata["z"] = BytesStorageMetadata{};
  const std::string message = encode_metadata_message(md);
  EXPECT_EQ(metadata_message_size(md), message.size());
  // Once as a key of state_dict_metadata, once in storage_data (not three times).
  EXPECT_EQ(occurrences(message, name), 2u);
  const Metadata back = decode_metadata_message(message);
  EXPECT_TRUE(back == md);
  ASSERT_EQ(back.storage_data.size(), 7u);
  std::vector<std::string> fqns;
  for (const auto& [index, info] : back.storage_data) fqns.push_back(index.fqn);
  EXPECT_EQ(fqns, (std::vector<std::string>{"", "", "", name, name, name, "z"}));

  // The first storage entry's name made a repeat: count 0 in place of the name's length + 1.
  Metadata one;
  one.storage_data[MetadataIndex(name)] = {"__0_0.distcp", 0, 4, {}};
  std::string bad = encode_metadata_message(one);
  const size_t at = bad.rfind(name);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bad[at - 1], static_cast<char>(name.size() + 1));
  bad.replace(at - 1, name.size() + 1, std::string(1, '\0'));
  try {
    decode_metadata_message(bad);
    ADD_FAILURE() << "a repeated name with no name before it was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("repeated name"), std::string::npos) << e.what();
  }

  // Read items: the storage name goes once where it is the dest name, whole where it differs.
  LoadPlan load;
  load.items.push_back(ReadItem{LoadItemType::TENSOR, MetadataIndex(name, Dims{0, 0}), {0, 0},
                                MetadataIndex(name, Dims{0, 0}, 0), {0, 0}, {2, 2}});
  load.items.push_back(ReadItem{LoadItemType::TENSOR, MetadataIndex("model.w", Dims{0}), {0},
                                MetadataIndex("w", Dims{0}, 3), {0}, {4}});
  const std::string load_bytes = encode_load_plan(load);
  EXPECT_EQ(occurrences(load_bytes, name), 1u);
  const LoadPlan load_back = decode_load_plan(load_bytes);
  ASSERT_EQ(load_back.items.size(), 2u);
  EXPECT_EQ(load_back.items[0].dest_index.fqn, name);
  EXPECT_EQ(load_back.items[0].storage_index.fqn, name);
  EXPECT_EQ(load_back.items[1].dest_index.fqn, "model.w");
  EXPECT_EQ(load_back.items[1].storage_index.fqn, "w");
  EXPECT_EQ(load_back.items[1].storage_index.index, std::optional<int64_t>(3));
  // A dest name has nothing before it to repeat.
  std::string bad_load = load_bytes;
  const size_t dest_at = bad_load.find(name);
  bad_load.replace(dest_at - 1, name.size() + 1, std::string(1, '\0'));
  EXPECT_THROW(decode_load_plan(bad_load), c10::Error);
}

// The wire's varints (util/wire.h): every width from one byte to ten round-trips, values of
// either sign, at the end of a message and before more bytes; the Sizer counts what the Writer
// writes; and a truncated varint, a longer form than the writer makes, an eleventh byte or a
// count beyond what the message can hold raise.
TEST(WireTest, VarintsRoundTripEveryWidthAndRejectMalformedForms) {
  std::vector<int64_t> values{0, 1, -1, 63, -64, 64, -65, 127, 128, 8191, 8192, -8193};
  for (int shift = 14; shift < 63; shift += 7) {
    values.push_back(int64_t{1} << shift);
    values.push_back(-(int64_t{1} << shift));
    values.push_back((int64_t{1} << shift) - 1);
  }
  values.push_back(std::numeric_limits<int64_t>::max());
  values.push_back(std::numeric_limits<int64_t>::min());
  for (int64_t v : values) {
    for (bool at_end : {true, false}) {
      wire::Writer w;
      w.varint(v);
      w.ints(Dims{v, ~v, 3, v, v});  // five: more than Dims holds inline; ~v: the other sign
      if (!at_end) w.raw(std::string(wire::kMaxVarint, '\0'));
      wire::Sizer sizer;
      sizer.varint(v);
      sizer.ints(Dims{v, ~v, 3, v, v});
      const std::string bytes = w.take();
      EXPECT_EQ(sizer.size() + (at_end ? 0 : wire::kMaxVarint), bytes.size());
      wire::Reader r(bytes);
      EXPECT_EQ(r.varint(), v);
      EXPECT_EQ(r.ints(), (Dims{v, ~v, 3, v, v}));
      EXPECT_EQ(r.left(), at_end ? 0 : wire::kMaxVarint);
    }
  }
  // Each varint width once: 7 bits a byte.
  for (size_t width = 1; width <= wire::kMaxVarint; ++width) {
    const uint64_t u = width == 1 ? 0 : uint64_t{1} << (7 * (width - 1));
    wire::Writer w;
    w.varint(wire::unzigzag(u));
    EXPECT_EQ(w.size(), width);
  }

  auto rejects = [](const std::string& bytes, auto&& read) {
    wire::Reader r(bytes);
    EXPECT_THROW(read(r), c10::Error) << c10::str(bytes.size(), " bytes");
  };
  auto varint = [](wire::Reader& r) { return r.varint(); };
  auto ints = [](wire::Reader& r) { return r.ints(); };
  for (const std::string& malformed :
       {std::string("\x80\x00", 2),                            // 0 in two bytes
        std::string(10, '\xff') + std::string("\x01"),         // an eleventh byte
        std::string(9, '\xff') + std::string("\x02"),          // a 65th bit
        std::string(9, '\x80') + std::string("\x00", 1)}) {    // 0 in ten bytes
    rejects(malformed, varint);
    rejects(malformed + std::string(wire::kMaxVarint, '\0'), varint);
    rejects("\x01" + malformed, ints);
    rejects("\x01" + malformed + std::string(wire::kMaxVarint, '\0'), ints);
  }
  rejects(std::string(), varint);
  rejects(std::string("\x80"), varint);
  rejects(std::string("\xff\xff"), varint);
  rejects(std::string("\x02\x01"), ints);  // two values, one byte
  rejects(std::string("\x05" "abcd"),  // five bytes promised, four there
           [](wire::Reader& r) { return r.str(); });
  wire::Writer three;
  three.count(3);
  three.raw("abcdef");
  rejects(three.take(), [](wire::Reader& r) { return r.count(/*min_bytes_each=*/3); });
}

}  // namespace
}  // namespace dcp::detail
