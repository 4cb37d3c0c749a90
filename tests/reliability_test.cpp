// Regression tests of issue #13 (reliability under bad input and faults), one test per finding,
// named after it: each failed (crashed, hung or passed wrongly) before its fix.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <caffe2/serialize/inline_container.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "format/metadata_codec.h"
#include "format/pickle.h"
#include "format/torch_save.h"
#include "format/zip_directory.h"
#include "testing/archive.h"
#include "io/file.h"
#include "planner/planner_helpers.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

StateDict small_state() {
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {64, 64}, 1);  // 16 KiB
  sd["note"] = std::string(8192, 'x');                      // a byte item over 4 KiB
  sd["step"] = int64_t{7};
  return sd;
}

void expect_loads(const StateDict& expected, const std::string& dir) {
  StateDict out = testing::blank_like(expected);
  load(out, dir);
  const std::string diff = testing::describe_difference(Value(expected), Value(out));
  EXPECT_TRUE(diff.empty()) << diff;
}

// ---------------------------------------------------------------------------------------------
// Finding 1: a write error inside a record ended the process (std::terminate).

TEST(Issue13Finding1, ASinkFailingAnywhereInARecordRaises) {
  const at::Tensor tensor = testing::make_tensor(at::kFloat, {1000}, 3);
  const Value value = Value(List{Value(std::string(6000, 'v')), Value(tensor)});
  using Write = std::function<uint64_t(const detail::ByteSink&)>;
  const std::vector<Write> writes = {
      [&](const detail::ByteSink& s) { return detail::write_tensor_archive(tensor, s); },
      [&](const detail::ByteSink& s) { return detail::write_value_archive(value, s); }};
  for (const Write& write : writes) {
    const uint64_t size = write([](const void*, size_t) {});
    for (uint64_t cut : {uint64_t{0}, uint64_t{1}, uint64_t{40}, uint64_t{100}, uint64_t{4096},
                         size / 2, size - 1}) {
      uint64_t total = 0;
      auto failing = [&](const void*, size_t n) {
        total += n;
        TORCH_CHECK(total <= cut, "No space left on device (injected)");
      };
      try {
        write(failing);
        ADD_FAILURE() << "no error with the sink failing after " << cut << " bytes";
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
      }
    }
  }
}

// A real OS write error: RLIMIT_FSIZE makes writes past the limit fail with EFBIG, as a full
// disk fails them with ENOSPC. Every layout and both write paths report it as an error.
TEST(Issue13Finding1, AFileSizeLimitFailsTheSaveWithAnError) {
  testing::TempDir dir;
  const StateDict sd = small_state();
  save(sd, dir.sub("old"));
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  int k = 0;
  for (bool direct : {true, false}) {
    for (bool single_file : {true, false}) {
      FileSystemWriterOptions o;
      o.direct_io = direct;
      o.single_file_per_rank = single_file;
      FileSystemWriter writer(dir.sub("new" + std::to_string(k++)), o);
      rlimit small = saved;
      small.rlim_cur = 6000;  // inside the 8 KiB byte item and the 16 KiB tensor
      setrlimit(RLIMIT_FSIZE, &small);
      std::string message;
      try {
        save(sd, writer);
      } catch (const c10::Error& e) {
        message = e.what();
      }
      setrlimit(RLIMIT_FSIZE, &saved);
      EXPECT_NE(message.find("File too large"), std::string::npos)
          << "direct " << direct << ", single file " << single_file << ": " << message;
      EXPECT_FALSE(std::filesystem::exists(writer.path() + "/.metadata"));
    }
  }
  sigaction(SIGXFSZ, &previous, nullptr);
  expect_loads(sd, dir.sub("old"));
}

// ---------------------------------------------------------------------------------------------
// Finding 2: relative_path from '.metadata' was joined unchecked.

// Replaces the checkpoint's '.metadata' with `md` and removes its checksum file: a hostile
// '.metadata' comes without a matching checksum (or with none, as Python writes it), and what
// these tests check is what parsing and validation refuse.
void rewrite_metadata(const std::string& checkpoint, const Metadata& md) {
  const std::string bytes = detail::encode_metadata(md);
  detail::File f = detail::File::open(checkpoint + "/.metadata", O_WRONLY | O_TRUNC);
  f.write_all(bytes.data(), bytes.size());
  detail::remove_file(checkpoint + "/.metadata.checksum");
}

// Saves small_state() into `dir`/c and rewrites its '.metadata' with every data file name
// replaced by `name`.
void point_metadata_at(const testing::TempDir& dir, const std::string& name) {
  save(small_state(), dir.sub("c"));
  Metadata md = FileSystemReader(dir.sub("c")).read_metadata();
  for (auto& [index, info] : md.storage_data) info.relative_path = name;
  rewrite_metadata(dir.sub("c"), md);
}

std::string load_error(const std::string& checkpoint) {
  StateDict out = testing::blank_like(small_state());
  try {
    load(out, checkpoint);
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Issue13Finding2, DataFileNamesCannotLeaveTheCheckpointDirectory) {
  struct Case {
    std::string name;      // what .metadata names
    std::string expected;  // in the error
  };
  testing::TempDir probe;
  const std::string outside = probe.sub("outside");
  const std::vector<Case> cases = {
      {"../outside/__0_0.distcp", "'..' component"},
      {"sub/../../outside/__0_0.distcp", "'..' component"},
      {"/dev/zero", "is an absolute path"},
      {outside + "/__0_0.distcp", "is an absolute path"},
      {std::string("__0_0.distcp\0../x", 17), "holds a NUL byte"},
      {"", "is empty"},
      {"fifo.distcp", "is not a regular file"},
      {"link.distcp", "outside the checkpoint directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    testing::TempDir dir;
    // A real checkpoint outside, so that an escaping name would find valid records.
    save(small_state(), dir.sub("outside"));
    point_metadata_at(dir, c.name == outside + "/__0_0.distcp"
                               ? dir.sub("outside/__0_0.distcp")
                               : c.name);
    ASSERT_EQ(mkfifo(dir.sub("c/fifo.distcp").c_str(), 0644), 0);
    std::filesystem::create_symlink(dir.sub("outside/__0_0.distcp"), dir.sub("c/link.distcp"));
    const std::string message = load_error(dir.sub("c"));
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    EXPECT_NE(message.find("reading '"), std::string::npos) << message;  // names the entry
  }
}

TEST(Issue13Finding2, ASymlinkThatStaysInsideLoads) {
  testing::TempDir dir;
  point_metadata_at(dir, "alias.distcp");
  std::filesystem::create_symlink("__0_0.distcp", dir.sub("c/alias.distcp"));
  expect_loads(small_state(), dir.sub("c"));
}

// ---------------------------------------------------------------------------------------------
// Finding 3: staging failing on one rank left the other ranks' background saves waiting.

// Waits for `future` at most `seconds`; a hang ends the test binary with a message (threads
// stuck in a collective could not be joined).
void wait_bounded(const AsyncSaveFuture& future, int seconds, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!future.done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "HANG: %s did not finish within %d s\n", what, seconds);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(Issue13Finding3, AStagingFailureOnOneRankReachesEveryRanksFuture) {
  testing::TempDir dir;
  std::vector<std::string> messages(3);
  std::vector<bool> next_ok(3, false);
  run_in_process(3, [&](Communicator& comm) {
    auto stager = std::make_shared<DefaultStager>();
    AsyncSaveOptions options;
    options.comm = &comm;
    options.stager = stager;
    StateDict sd;
    sd["w"] = comm.rank() == 1 ? at::Tensor() : at::ones({4});  // undefined on rank 1
    AsyncSaveFuture failed = async_save(sd, dir.sub("bad"), options);
    wait_bounded(failed, 60, "a save with a failed staging");
    try {
      failed.get();
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what();
    }
    // The stager and the communicator stay usable.
    sd["w"] = at::ones({4});
    AsyncSaveFuture good = async_save(sd, dir.sub("good"), options);
    wait_bounded(good, 60, "the next save");
    good.get();
    next_ok[comm.rank()] = true;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(messages[r].find("failed on rank 1 of 3"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("async_save staging"), std::string::npos) << messages[r];
    EXPECT_TRUE(next_ok[r]);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.sub("bad/.metadata")));
}

TEST(Issue13Finding3, AStagingFailureAloneFailsTheFutureNotTheCall) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = at::Tensor();
  AsyncSaveFuture f = async_save(sd, dir.sub("c"));
  EXPECT_THROW(f.get(), c10::Error);
  AsyncSaveFuture none = async_save(sd, std::shared_ptr<StorageWriter>());
  try {
    none.get();
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no storage writer"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Finding 5: async_save staged values whose paths encoded alike into one buffer.

TEST(Issue13Finding5, ValuesAtPlacesThatUsedToEncodeAlikeKeepTheirOwnBuffers) {
  const at::Tensor t1 = testing::make_tensor(at::kFloat, {8}, 1);
  const at::Tensor t2 = testing::make_tensor(at::kFloat, {8}, 2);
  std::vector<StateDict> states(3);
  states[0]["a/b"] = t1;
  states[0]["a"] = Dict{};
  states[0]["a"].dict()["b"] = t2;
  states[1][Key(int64_t{0})] = t1;
  states[1]["#0"] = t2;
  states[2]["x"] = List{Value(t1)};
  states[2]["x[0]"] = t2;
  auto stager = std::make_shared<DefaultStager>();
  for (size_t k = 0; k < states.size(); ++k) {
    SCOPED_TRACE(k);
    testing::TempDir dir;
    AsyncSaveOptions options;
    options.stager = stager;  // buffers reused across the three saves, as in training
    async_save(states[k], dir.sub("c"), options).get();
    expect_loads(states[k], dir.sub("c"));
  }
}

// ---------------------------------------------------------------------------------------------
// Findings 6 and 7: sizes from '.metadata' overflowed, and bad chunk geometry loaded
// "successfully" with the destination unfilled or shifted.

// Saves `sd` into `dir`/c, applies `edit` to its metadata and writes it back.
void save_and_edit(const testing::TempDir& dir, const StateDict& sd,
                   const std::function<void(Metadata&)>& edit) {
  save(sd, dir.sub("c"));
  Metadata md = FileSystemReader(dir.sub("c")).read_metadata();
  edit(md);
  rewrite_metadata(dir.sub("c"), md);
}

TensorStorageMetadata& tensor_entry(Metadata& md, const std::string& fqn) {
  return std::get<TensorStorageMetadata>(md.state_dict_metadata.at(fqn));
}

// Moves chunk `fqn`@old_offsets to new_offsets in both the chunk list and storage_data.
void move_chunk(Metadata& md, const std::string& fqn, const std::vector<int64_t>& old_offsets,
                const std::vector<int64_t>& new_offsets) {
  for (auto& c : tensor_entry(md, fqn).chunks) {
    if (c10::IntArrayRef(c.offsets) == old_offsets) c.offsets = new_offsets;
  }
  const MetadataIndex old_index(fqn, old_offsets);
  StorageInfo info = md.storage_data.at(old_index);
  md.storage_data.erase(old_index);
  md.storage_data.emplace(MetadataIndex(fqn, new_offsets), std::move(info));
}

TEST(Issue13Finding7, BadChunkGeometryIsAnErrorNamingKeyAndChunk) {
  StateDict sd;
  sd["w"] = zeros_sharded({8, 4}, at::kFloat, {2}, 0, {Placement::Shard(0)});
  sd["w"].get<ShardedTensor>().local_shards()[0].tensor.copy_(
      testing::make_tensor(at::kFloat, {4, 4}, 1));
  StateDict dest;
  dest["w"] = at::zeros({8, 4});
  struct Case {
    const char* name;
    std::function<void(Metadata&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"chunk outside the tensor", [](Metadata& md) { move_chunk(md, "w", {0, 0}, {6, 0}); },
       "leaves the tensor's shape"},
      {"negative offset", [](Metadata& md) { move_chunk(md, "w", {0, 0}, {-2, 0}); },
       "leaves the tensor's shape"},
      {"negative size",
       [](Metadata& md) { tensor_entry(md, "w").chunks[0].sizes = {-4, 4}; }, "negative"},
      {"no chunks", [](Metadata& md) { tensor_entry(md, "w").chunks.clear(); },
       "chunks cover 0 of 32 elements"},
      {"a chunk short", [](Metadata& md) { tensor_entry(md, "w").chunks[0].sizes = {3, 4}; },
       "chunks cover 12 of 32 elements"},
  };
  // The save above holds only rank 0's half; saving it alone (one rank) is a valid
  // partial checkpoint, which a whole-tensor load must refuse too.
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    testing::TempDir dir;
    save_and_edit(dir, sd, c.edit);
    StateDict out = dest;
    out["w"] = at::zeros({8, 4});
    try {
      load(out, dir.sub("c"));
      ADD_FAILURE() << "loaded";
    } catch (const c10::ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
    }
  }
}

TEST(Issue13Finding7, TwoEntriesOnTheSameBytesAndBytesForATensorAreErrors) {
  StateDict sd;
  sd["a"] = testing::make_tensor(at::kFloat, {16}, 1);
  sd["b"] = testing::make_tensor(at::kFloat, {16}, 2);
  sd["s"] = std::string("text");
  {
    testing::TempDir dir;
    save_and_edit(dir, sd, [](Metadata& md) {
      md.storage_data[MetadataIndex("b", std::vector<int64_t>{0})] =
          md.storage_data.at(MetadataIndex("a", std::vector<int64_t>{0}));
    });
    StateDict out = testing::blank_like(sd);
    try {
      load(out, dir.sub("c"));
      ADD_FAILURE() << "loaded";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("the ranges overlap"), std::string::npos) << e.what();
    }
  }
  {
    testing::TempDir dir;
    save(sd, dir.sub("c"));
    StateDict out = testing::blank_like(sd);
    out["s"] = at::zeros({3});  // a tensor where the checkpoint holds a string
    EXPECT_THROW(load(out, dir.sub("c")), c10::TypeError);
  }
  {
    testing::TempDir dir;
    save_and_edit(dir, sd, [](Metadata& md) {
      md.storage_data.at(MetadataIndex("a", std::vector<int64_t>{0})).offset = -64;
    });
    StateDict out = testing::blank_like(sd);
    try {
      load(out, dir.sub("c"));
      ADD_FAILURE() << "loaded";
    } catch (const c10::Error& e) {
      // Refused when the metadata is decoded, before any read is planned.
      EXPECT_NE(std::string(e.what()).find("'a' has a negative offset"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Issue13Finding6, OverflowingChunkGeometryIsRefused) {
  const int64_t big = int64_t{1} << 62;
  struct Case {
    const char* name;
    std::vector<int64_t> offsets, sizes;
  };
  // Each wrapped around int64 before the fix and passed the bounds or volume checks.
  const std::vector<Case> cases = {
      {"offset + size", {INT64_MAX - 1, 0}, {4, 4}},
      {"volume", {0, 0}, {big, 8}},
  };
  TensorStorageMetadata t;
  t.size = {big, 8};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    t.chunks = {ChunkStorageMetadata{Dims(c.offsets), Dims(c.sizes)}};
    std::string problem = detail::validate_chunks("w", t, true);
    EXPECT_FALSE(problem.empty());
  }
  t.size = {big, 16};  // the tensor's own volume overflows
  t.chunks = {ChunkStorageMetadata{{0, 0}, {1, 16}}};
  EXPECT_NE(detail::validate_chunks("w", t, true).find("overflows"), std::string::npos);
}

using testing::archive_of;
using testing::StringSource;

// A tensor record whose data.pkl says sizes (3, 3) and strides (2^62, 2^62) over a 16-byte
// storage: the last element's index, 2 * 2^62 + 2 * 2^62 = 2^64, wrapped to 0.
std::string overflowing_view_archive() {
  namespace pickle = detail::pickle;
  pickle::Writer w;
  w.global("torch._utils", "_rebuild_tensor_v2");
  w.mark();
  w.mark();
  w.str("storage");
  w.global("torch", "FloatStorage");
  w.str("0");
  w.str("cpu");
  w.integer(4);
  w.tuple_from_mark();
  w.binpersid();
  w.integer(0);
  w.begin_tuple(2);
  w.integer(3);
  w.integer(3);
  w.end_tuple(2);
  w.begin_tuple(2);
  w.integer(int64_t{1} << 62);
  w.integer(int64_t{1} << 62);
  w.end_tuple(2);
  w.boolean(false);
  w.global("collections", "OrderedDict");
  w.empty_tuple();
  w.reduce();
  w.tuple_from_mark();
  w.reduce();
  const float storage[4] = {1, 2, 3, 4};
  return archive_of(w.finish(), std::string(reinterpret_cast<const char*>(storage), 16));
}

TEST(Issue13Finding6, AViewWhoseExtentOverflowsIsRefused) {
  const StringSource source(overflowing_view_archive());
  try {
    detail::read_tensor_record(source);
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor view reaches past its storage"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Finding 8: a zip directory declaring a huge data.pkl made LibTorch allocate it.

TEST(Issue13Finding8, DeclaredRecordSizesAreBoundedByTheItem) {
  std::string bytes;
  detail::write_value_archive(Value(std::string("hello")),
                              [&](const void* d, size_t n) {
                                bytes.append(static_cast<const char*>(d), n);
                              });
  // Declare archive/data.pkl deflated to 3.75 GiB in the central directory (miniz accepts
  // that; LibTorch would allocate it).
  const std::string name = "archive/data.pkl";
  size_t patched = 0;
  for (size_t at = bytes.find("PK\x01\x02"); at != std::string::npos;
       at = bytes.find("PK\x01\x02", at + 4)) {
    uint16_t name_length;
    std::memcpy(&name_length, bytes.data() + at + 28, 2);
    if (bytes.compare(at + 46, name_length, name) != 0) continue;
    const uint32_t huge = 0xF0000000u;
    const uint16_t deflate = 8;
    std::memcpy(&bytes[at + 10], &deflate, 2);  // method
    std::memcpy(&bytes[at + 24], &huge, 4);     // uncompressed size
    ++patched;
  }
  ASSERT_EQ(patched, 1u);
  const StringSource source(bytes);
  try {
    detail::read_value_archive(source);
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("record 'archive/data.pkl' is compressed"),
              std::string::npos)
        << e.what();
  }
  // Stored, but larger than the item.
  for (size_t at = bytes.find("PK\x01\x02"); at != std::string::npos;
       at = bytes.find("PK\x01\x02", at + 4)) {
    const uint16_t stored = 0;
    std::memcpy(&bytes[at + 10], &stored, 2);
    const uint32_t huge = 0xF0000000u;
    if (bytes.compare(at + 46, name.size(), name) == 0) std::memcpy(&bytes[at + 20], &huge, 4);
  }
  try {
    detail::read_value_archive(StringSource(bytes));
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("declares 4026531840 bytes, more than the item's"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Finding 4: small pickles that share objects through the memo expanded without bound.

TEST(Issue13Finding4, AMemoSharedDagIsRefusedQuickly) {
  // x = []; 64 times: x = [x, x]. Python's torch.load shares the lists; a tree of Values
  // would hold 2^64 of them.
  using namespace std::string_literals;  // the opcodes hold NUL bytes
  std::string pkl = "\x80\x02]q\x00" "0"s;
  for (int k = 0; k < 64; ++k) pkl += "](h\x00h\x00" "eq\x00" "0"s;
  pkl += "h\x00."s;
  const auto start = std::chrono::steady_clock::now();
  try {
    detail::read_value_archive(StringSource(archive_of(pkl)));
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expands to more than"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  // A modest sharing, as Python's pickler produces for a repeated object, still loads.
  const std::string shared = "\x80\x02X\x03\x00\x00\x00" "abcq\x00" "0](h\x00h\x00h\x00" "e."s;
  const Value v = detail::read_value_archive(StringSource(archive_of(shared)));
  EXPECT_EQ(v, Value(List{Value("abc"), Value("abc"), Value("abc")}));
}

// What fuzzing found (tests/fuzz/regressions/<target>/): each input, fed as its target feeds
// it, must be refused with the expansion budget's error. The record_pickle ones are tiny
// data.pkl files (292 bytes) that built 64 MiB of nested values, seconds under ASan, before the
// budget's slack went from 64 to 8 MiB.
TEST(Issue13Finding4, FuzzFindingsAreRefusedByTheExpansionBudget) {
  const std::filesystem::path dir =
      std::filesystem::path(DCP_SOURCE_DIR) / "tests/fuzz/regressions/record_pickle";
  int inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string pkl((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const StringSource source(archive_of(pkl, std::string(64, '\x5a')));
    try {
      detail::read_value_archive(source);
      ADD_FAILURE() << entry.path() << " was read";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("expands to more than"), std::string::npos)
          << entry.path() << ": " << e.what();
    }
    ++inputs;
  }
  EXPECT_GE(inputs, 2);
}

// What fuzzing found in fuzz_record (tests/fuzz/regressions/record/): each input, fed to the
// record readers as fuzz_record feeds it, is refused with c10::Error before LibTorch's zip
// reader allocates what a directory entry declares (Note [Declared sizes]). The first: an end
// record whose 32-bit fields claim an empty directory, after a zip64 record that gives the real
// one (miniz reads the zip64 one), where an entry declares 4 GiB; the walk checked the empty
// directory and LibTorch then allocated 4 GiB.
TEST(Issue13Finding8, FuzzFindingsInRecordsAreRefusedBeforeLibTorchAllocates) {
  const std::filesystem::path dir =
      std::filesystem::path(DCP_SOURCE_DIR) / "tests/fuzz/regressions/record";
  int inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const StringSource source(
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    const std::string name = entry.path().filename().string();
    if (name.rfind("oom-", 0) == 0) {  // refused by the directory walk, before LibTorch
      try {
        detail::read_zip_directory(source);
        ADD_FAILURE() << entry.path() << " was read";
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("disagrees with its zip64 record"),
                  std::string::npos)
            << entry.path() << ": " << e.what();
      }
    }
    // Every reader refuses with c10::Error (not std::out_of_range, not a crash), naming the item.
    const auto refused = [&](auto&& read) {
      try {
        read();
        ADD_FAILURE() << entry.path() << " was read";
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("corrupt item"), std::string::npos)
            << entry.path() << ": " << e.what();
      }
    };
    refused([&] { detail::read_tensor_record(source); });
    refused([&] { detail::read_tensor_archive(source); });
    refused([&] { detail::read_value_archive(source); });
    ++inputs;
  }
  EXPECT_GE(inputs, 2);
}

// Fuzz finding (fuzz_record, CI of 3b1b3c9): PyTorchStreamReader::init parses the version
// record with std::stoull and catches only std::invalid_argument; a version of 23 digits threw
// std::out_of_range through every reader (the fuzz target's process ended in std::terminate).
// Records are now read without LibTorch's reader (Note [Reading records without LibTorch]).
TEST(Issue13Finding8, OverlongVersionRecordIsRefusedAsCorruptItem) {
  const std::filesystem::path file = std::filesystem::path(DCP_SOURCE_DIR) /
                                     "tests/fuzz/regressions/record/out-of-range-version-9e89b013";
  std::ifstream in(file, std::ios::binary);
  const StringSource source(
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  EXPECT_NO_THROW(detail::read_zip_directory(source));  // a well-formed zip
  try {
    detail::read_tensor_record(source);
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("version record '99999999999999999999999"), std::string::npos) << what;
    EXPECT_NE(what.find("is not a torch.save format version"), std::string::npos) << what;
  }
}

// The records of a tensor archive (write_tensor_archive), rewritten by PyTorchStreamWriter with
// `version` as the version record; `rename` renames records in the directory only.
std::string archive_with_version(const std::string& version) {
  std::string original;
  detail::write_tensor_archive(at::arange(6, at::kFloat), [&](const void* d, size_t n) {
    original.append(static_cast<const char*>(d), n);
  });
  std::istringstream in(original);  // IStreamAdapter does not own its stream
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_unique<caffe2::serialize::IStreamAdapter>(&in));
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* d, size_t n) {
    out.append(static_cast<const char*>(d), n);
    return n;
  });
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") {
      continue;
    }
    auto [data, size] = reader.getRecord(name);
    writer.writeRecord(name, data.get(), size);
  }
  writer.writeRecord("version", version.data(), version.size());
  writer.writeEndOfFile();
  return out;
}

// dcp reads a version record as PyTorchStreamReader::init does (std::stoull, then LibTorch's
// supported range), except that it refuses with c10::Error where LibTorch let
// std::out_of_range out.
TEST(ReadingRecordsWithoutLibTorch, VersionRecordsAreAcceptedExactlyWhereLibTorchAcceptsThem) {
  for (const std::string version :
       {"3\n", "1", "10\n", " +7\n", "6abc", "0\n", "11\n", "-1\n", "abc", "", "\n",
        "99999999999999999999999\n", "18446744073709551616", "4\x00"}) {
    const std::string bytes = archive_with_version(version);
    bool libtorch_reads = true;
    std::istringstream in(bytes);
    try {
      caffe2::serialize::PyTorchStreamReader check(
          std::make_unique<caffe2::serialize::IStreamAdapter>(&in));
    } catch (const std::exception&) {
      libtorch_reads = false;
    }
    const StringSource source(bytes);
    bool dcp_reads = true;
    try {
      const detail::TensorRecord r = detail::read_tensor_record(source);
      EXPECT_EQ(r.sizes, std::vector<int64_t>{6});
    } catch (const c10::Error& e) {
      dcp_reads = false;
      EXPECT_NE(std::string(e.what()).find("is not a torch.save format version"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(dcp_reads, libtorch_reads) << "version record '" << version << "'";
  }
}

TEST(ReadingRecordsWithoutLibTorch, DuplicateRecordsAndBadSmallRecordsAreRefused) {
  std::string bytes;
  detail::write_value_archive(Value(std::vector<Value>{at::ones({2}), at::zeros({2})}),
                              [&](const void* d, size_t n) {
                                bytes.append(static_cast<const char*>(d), n);
                              });
  ASSERT_NO_THROW(detail::read_value_archive(StringSource(bytes)));
  auto refused = [](const std::string& archive, const std::string& expected) {
    try {
      detail::read_value_archive(StringSource(archive));
      ADD_FAILURE() << "accepted; expected " << expected;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  // Two directory entries named archive/data/0 (the second was archive/data/1).
  std::string twice = bytes;
  const size_t cd = twice.find("PK\x01\x02");
  const size_t second = twice.find("archive/data/1", cd);
  ASSERT_NE(second, std::string::npos);
  twice[second + 13] = '0';
  refused(twice, "record 'archive/data/0' appears twice");
  // A flipped byte inside data.pkl (its first byte is PROTO 2: 0x80 0x02).
  std::string flipped = bytes;
  const size_t pkl = flipped.find(std::string("\x80\x02", 2));
  ASSERT_NE(pkl, std::string::npos);
  flipped[pkl + 1] = 3;
  refused(flipped, "record 'archive/data.pkl' at archive bytes");
  // A first entry outside any folder.
  std::string no_folder = bytes;
  const size_t first = no_folder.find("archive/data.pkl", cd);
  ASSERT_NE(first, std::string::npos);
  no_folder[first + 7] = '_';
  refused(no_folder, "is not in a folder");
}

TEST(Issue13Finding4, SparseMemoIndicesCostMemoryLinearInTheInput) {
  // 200,000 LONG_BINPUTs, each 1023 past the last: the dense memo grew by 8 KiB per 5 input
  // bytes (1.6 GB here). Run in a child under an address-space limit of 512 MiB above now.
  std::string pkl = "\x80\x02N";  // no NUL: a plain literal is whole
  for (uint32_t k = 0; k < 200000; ++k) {
    const uint32_t index = k * 1023;
    pkl += 'r';
    pkl.append(reinterpret_cast<const char*>(&index), 4);
  }
  pkl += '.';
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit as{};
    getrlimit(RLIMIT_AS, &as);
    long vm_kib = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      long pages = 0;
      if (std::fscanf(f, "%ld", &pages) == 1) vm_kib = pages * (sysconf(_SC_PAGESIZE) / 1024);
      std::fclose(f);
    }
    as.rlim_cur = static_cast<rlim_t>(vm_kib + (512 << 10)) * 1024;
    setrlimit(RLIMIT_AS, &as);
    try {
      detail::pickle::unpickle(pkl, "test");
      std::_Exit(0);
    } catch (const std::bad_alloc&) {
      std::_Exit(2);
    } catch (...) {
      std::_Exit(3);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: out of memory, 3: another error";
}

TEST(Issue13Finding4, MetadataTensorsHaveAtMost64Dimensions) {
  Metadata md;
  TensorStorageMetadata t;
  t.size = std::vector<int64_t>(65, 1);
  t.chunks = {ChunkStorageMetadata{Dims(65, 0), Dims(65, 1)}};
  md.state_dict_metadata["w"] = t;
  const std::string bytes = detail::encode_metadata(md);
  try {
    detail::decode_metadata(bytes.data(), bytes.size(), "test");
    ADD_FAILURE() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("65 dimensions; at most 64"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Finding 9: two saves into one directory both "succeeded", and a failed re-save left no
// checkpoint at all.

// Signals when its write_data starts, then waits for `go` before writing.
class GatedWriter : public StorageWriterWrapper {
 public:
  GatedWriter(std::shared_ptr<StorageWriter> target, std::atomic<bool>* writing,
              std::atomic<bool>* go)
      : StorageWriterWrapper(std::move(target)), writing_(writing), go_(go) {}
  std::future<std::vector<WriteResult>> write_data(const SavePlan& plan,
                                                   SavePlanner& planner) override {
    *writing_ = true;
    while (!*go_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return StorageWriterWrapper::write_data(plan, planner);
  }

 private:
  std::atomic<bool>* writing_;
  std::atomic<bool>* go_;
};

TEST(Issue13Finding9, OfTwoSavesIntoOneDirectoryAtOnceExactlyOneCommits) {
  testing::TempDir dir;
  StateDict a, b;
  a["w"] = testing::make_tensor(at::kFloat, {256}, 1);
  b["w"] = testing::make_tensor(at::kFloat, {256}, 2);
  for (bool resave : {false, true}) {
    SCOPED_TRACE(resave ? "into an existing checkpoint" : "into a fresh directory");
    const std::string ckpt = dir.sub(resave ? "existing" : "fresh");
    if (resave) save(b, ckpt);
    std::atomic<bool> writing{false}, go{false};
    std::thread first([&] {
      GatedWriter gated(std::make_shared<FileSystemWriter>(ckpt), &writing, &go);
      save(a, gated);
    });
    while (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::string second_error;
    try {
      save(b, ckpt);  // while the first holds the directory
    } catch (const c10::Error& e) {
      second_error = e.what();
    }
    go = true;
    first.join();
    EXPECT_NE(second_error.find("another save is writing checkpoint"), std::string::npos)
        << second_error;
    expect_loads(a, ckpt);  // the first one's, whole
    save(b, ckpt);          // and the directory is free again
    expect_loads(b, ckpt);
    for (const auto& name : detail::list_directory(ckpt)) {
      EXPECT_TRUE(name == ".metadata" || name == ".metadata.checksum" ||
                  name.find(".distcp") != std::string::npos)
          << name;
    }
  }
}

TEST(Issue13Finding9, AResaveThatRunsOutOfSpaceKeepsThePreviousCheckpoint) {
  testing::TempDir dir;
  const StateDict old_state = small_state();
  save(old_state, dir.sub("c"));
  const std::vector<std::string> old_files = detail::list_directory(dir.sub("c"));
  StateDict new_state = small_state();
  new_state["w"] = testing::make_tensor(at::kFloat, {64, 64}, 9);
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  for (bool direct : {true, false}) {
    FileSystemWriterOptions o;
    o.direct_io = direct;
    FileSystemWriter writer(dir.sub("c"), o);
    rlimit small = saved;
    small.rlim_cur = 6000;
    setrlimit(RLIMIT_FSIZE, &small);
    EXPECT_THROW(save(new_state, writer), c10::Error);
    setrlimit(RLIMIT_FSIZE, &saved);
    expect_loads(old_state, dir.sub("c"));
    // Nothing of the failed save stays where it could be removed.
    EXPECT_EQ(detail::list_directory(dir.sub("c")).size(), old_files.size());
  }
  sigaction(SIGXFSZ, &previous, nullptr);
  save(new_state, dir.sub("c"));
  expect_loads(new_state, dir.sub("c"));
}

// ---------------------------------------------------------------------------------------------
// Integrity: a flipped byte in tensor data loaded silently; now the zip entry's CRC-32 catches
// it whenever a load reads the whole storage.

TEST(Issue13Integrity, AFlippedTensorByteFailsTheCrcCheckOnLoad) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {64, 64}, 1);
  const at::Tensor inner = testing::make_tensor(at::kFloat, {100}, 2);
  sd["pair"] = Tuple{{Value(inner), Value(int64_t{1})}};  // a byte item holding a tensor
  const Metadata md = save(sd, dir.sub("c"));
  for (const auto& [index, info] : md.storage_data) {
    SCOPED_TRACE(index.fqn);
    const std::string path = dir.sub("c/" + info.relative_path);
    const std::string original = detail::read_file(path);
    // A byte inside the item's tensor data.
    const at::Tensor& t = index.fqn == "w" ? sd["w"].tensor() : inner;
    const std::string bytes(static_cast<const char*>(t.data_ptr()), t.nbytes());
    const size_t at = original.find(bytes, info.offset);
    ASSERT_NE(at, std::string::npos);
    ASSERT_LT(at + bytes.size(), static_cast<size_t>(info.offset + info.length));
    const uint64_t target = at + bytes.size() - 4;
    std::string corrupt = original;
    corrupt[target] = static_cast<char>(corrupt[target] ^ 0x01);
    {
      detail::File f = detail::File::open(path, O_WRONLY | O_TRUNC);
      f.write_all(corrupt.data(), corrupt.size());
    }
    for (bool ranged : {true, false}) {
      FileSystemReaderOptions o;
      o.ranged_reads = ranged;
      FileSystemReader reader(dir.sub("c"), o);
      StateDict out = testing::blank_like(sd);
      try {
        load(out, reader);
        ADD_FAILURE() << "loaded a flipped byte (ranged " << ranged << ")";
      } catch (const c10::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
        EXPECT_NE(msg.find(info.relative_path), std::string::npos) << msg;
      }
    }
    // With the check off, the flip goes through: what it protects against.
    FileSystemReaderOptions off;
    off.verify_crc32 = false;
    FileSystemReader unchecked(dir.sub("c"), off);
    StateDict out = testing::blank_like(sd);
    if (index.fqn == "w") {
      load(out, unchecked);
      EXPECT_FALSE(testing::describe_difference(Value(sd), Value(out)).empty());
    }
    detail::File f = detail::File::open(path, O_WRONLY | O_TRUNC);
    f.write_all(original.data(), original.size());
  }
}

TEST(Issue13Integrity, VerifyFindsNothingInASoundCheckpoint) {
  testing::TempDir dir;
  const StateDict sd = testing::reference_state_dict();
  FileSystemWriterOptions o;
  o.thread_count = 3;
  FileSystemWriter writer(dir.sub("c"), o);
  const Metadata md = save(sd, writer);
  const VerifyReport report = verify(dir.sub("c"));
  for (const auto& p : report.problems) ADD_FAILURE() << p.key << " " << p.file << ": " << p.message;
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.records, static_cast<int64_t>(md.storage_data.size()));
}

TEST(Issue13Integrity, VerifyReportsEveryProblemWithKeyFileAndRange) {
  testing::TempDir dir;
  StateDict sd;
  sd["a"] = testing::make_tensor(at::kFloat, {256}, 1);
  sd["b"] = testing::make_tensor(at::kFloat, {256}, 2);
  sd["c"] = testing::make_tensor(at::kFloat, {8, 4}, 3);
  sd["s"] = std::string("value");
  save_and_edit(dir, sd, [](Metadata& md) {
    md.storage_data.at(MetadataIndex("b", std::vector<int64_t>{0})).offset += 1 << 20;
    md.storage_data.erase(MetadataIndex("s"));
    tensor_entry(md, "c").chunks[0].sizes = {4, 4};  // half the tensor uncovered
  });
  // And a flipped byte inside a's tensor data.
  const Metadata md = FileSystemReader(dir.sub("c")).read_metadata();
  const StorageInfo a = md.storage_data.at(MetadataIndex("a", std::vector<int64_t>{0}));
  const std::string path = dir.sub("c/" + a.relative_path);
  std::string bytes = detail::read_file(path);
  const at::Tensor& ta = sd["a"].tensor();
  const size_t at = bytes.find(std::string(static_cast<const char*>(ta.data_ptr()), ta.nbytes()));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 100] = static_cast<char>(bytes[at + 100] ^ 0x10);
  {
    detail::File f = detail::File::open(path, O_WRONLY | O_TRUNC);
    f.write_all(bytes.data(), bytes.size());
  }
  const VerifyReport report = verify(dir.sub("c"));
  std::map<std::string, std::string> found;
  for (const auto& p : report.problems) found[p.key] += p.message + " | ";
  EXPECT_NE(found["a"].find("CRC-32"), std::string::npos) << found["a"];
  EXPECT_NE(found["b"].find("outside the file"), std::string::npos) << found["b"];
  EXPECT_NE(found["c"].find("chunks cover 16 of 32"), std::string::npos) << found["c"];
  EXPECT_NE(found["s"].find("no storage entry"), std::string::npos) << found["s"];
  for (const auto& p : report.problems) {
    if (p.key == "a") {
      EXPECT_EQ(p.file, a.relative_path);
      EXPECT_EQ(p.begin, a.offset);
      EXPECT_EQ(p.end, a.offset + a.length);
    }
  }
}

TEST(Issue13Integrity, VerifyDetectsEveryFlippedByteOfTensorData) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {16}, 1);
  const Metadata md = save(sd, dir.sub("c"));
  const StorageInfo& info = md.storage_data.begin()->second;
  const std::string path = dir.sub("c/" + info.relative_path);
  const std::string original = detail::read_file(path);
  const at::Tensor& t = sd["w"].tensor();
  const size_t at = original.find(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
  ASSERT_NE(at, std::string::npos);
  for (size_t k = at; k < at + t.nbytes(); ++k) {
    std::string corrupt = original;
    corrupt[k] = static_cast<char>(corrupt[k] ^ 0x80);
    {
      detail::File f = detail::File::open(path, O_WRONLY | O_TRUNC);
      f.write_all(corrupt.data(), corrupt.size());
    }
    const VerifyReport report = verify(dir.sub("c"));
    EXPECT_FALSE(report.ok()) << "flip at byte " << k << " went unnoticed";
  }
  detail::File f = detail::File::open(path, O_WRONLY | O_TRUNC);
  f.write_all(original.data(), original.size());
  EXPECT_TRUE(verify(dir.sub("c")).ok());
}

// ---------------------------------------------------------------------------------------------
// Finding 10: a rank that never arrives left the others waiting forever.

TEST(Issue13Finding10, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  MemoryStorage storage;
  std::vector<std::string> messages(3);
  const auto start = std::chrono::steady_clock::now();
  run_in_process(3, [&](Communicator& comm) {
    if (comm.rank() == 2) return;  // never enters the save
    StateDict sd;
    sd["w"] = at::ones({4});
    MemoryWriter writer(storage, "c");
    SaveOptions options;
    options.comm = &comm;
    options.timeout = std::chrono::milliseconds(300);
    try {
      save(sd, writer, options);
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what();
    }
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(messages[r].find("rank(s) 2 never arrived"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("rank " + std::to_string(r) + ": saving checkpoint"),
              std::string::npos)
        << messages[r];
  }
  EXPECT_FALSE(storage.get("c", ".metadata").has_value());
}

}  // namespace
}  // namespace dcp
