// The restricted pickle reader and the protocol-2 writer: table-driven round trips and
// malformed input.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/pickle.h"

namespace dcp::detail::pickle {
namespace {

Tree parse(const std::string& bytes) { return unpickle(bytes.data(), bytes.size(), "test"); }

TEST(PickleTest, IntegersRoundTripAtEveryEncodingBoundary) {
  const std::vector<int64_t> values = {0,          1,          255,       256,
                                       65535,      65536,      -1,        -256,
                                       INT32_MAX,  INT32_MIN,  int64_t{1} << 31,
                                       -(int64_t{1} << 31) - 1, int64_t{1} << 40,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
  for (int64_t v : values) {
    Writer w;
    w.integer(v);
    auto o = parse(w.finish());
    ASSERT_EQ(o->kind, Kind::Int) << v;
    EXPECT_EQ(o->i(), v);
  }
}

TEST(PickleTest, FloatsStringsBytesAndConstantsRoundTrip) {
  Writer w;
  w.mark();
  w.float64(0.1);
  w.float64(-1e300);
  w.str("");
  w.str("h\xc3\xa9llo");
  w.bytes(std::string("\x00\xff\x80z", 4));
  w.none();
  w.boolean(true);
  w.boolean(false);
  w.str("h\xc3\xa9llo");  // memoized: fetched with BINGET
  w.tuple_from_mark();
  auto o = parse(w.finish());
  ASSERT_EQ(o->kind, Kind::Tuple);
  ASSERT_EQ(o->items().size(), 9u);
  EXPECT_EQ(o->items()[0]->f(), 0.1);
  EXPECT_EQ(o->items()[1]->f(), -1e300);
  EXPECT_EQ(o->items()[2]->str(), "");
  EXPECT_EQ(o->items()[3]->str(), "h\xc3\xa9llo");
  EXPECT_TRUE(o->items()[4]->calls("_codecs", "encode"));
  EXPECT_EQ(o->items()[5]->kind, Kind::None);
  EXPECT_TRUE(o->items()[6]->b);
  EXPECT_FALSE(o->items()[7]->b);
  EXPECT_EQ(o->items()[8], o->items()[3]);  // same memo object
}

// A streaming writer hands out the in-memory writer's bytes, in order, in pieces no longer
// than its piece size, except a piece that holds one longer value alone.
TEST(PickleTest, AStreamingWriterHandsOutTheSameBytesInPieces) {
  const std::string long_str(100, 'x');
  auto fill = [&](Writer& w) {
    w.mark();
    for (int k = 0; k < 50; ++k) {
      w.integer(int64_t{1} << (k % 40));
      w.str("key" + std::to_string(k % 7));  // memoized from the 8th on
      w.float64(k * 0.5);
    }
    w.str(long_str);
    w.bytes(std::string("\x00\xff", 2));
    w.global("torch", "Size");
    w.tuple_from_mark();
  };
  Writer whole;
  EXPECT_FALSE(whole.streaming());
  fill(whole);
  const std::string expected = whole.finish();
  for (size_t piece_bytes : {size_t{1}, size_t{3}, size_t{16}, size_t{1} << 20}) {
    std::string streamed;
    std::vector<size_t> pieces;
    Writer w([&](std::string_view piece) {
      streamed.append(piece);
      pieces.push_back(piece.size());
    }, piece_bytes);
    EXPECT_TRUE(w.streaming());
    fill(w);
    EXPECT_EQ(w.finish(), "") << piece_bytes;
    EXPECT_EQ(streamed, expected) << piece_bytes;
    for (size_t n : pieces) {
      EXPECT_GT(n, 0u);
      EXPECT_LE(n, std::max(piece_bytes, long_str.size() + 5)) << piece_bytes;
    }
    if (piece_bytes < expected.size()) EXPECT_GT(pieces.size(), 1u) << piece_bytes;
    else EXPECT_EQ(pieces.size(), 1u);
  }
  // What the sink throws leaves the call that filled a piece.
  Writer failing([](std::string_view) { throw std::runtime_error("disk full"); }, 8);
  EXPECT_THROW(fill(failing), std::runtime_error);
}

TEST(PickleTest, StringsOfAShortPickleOutliveTheParse) {
  // A pickle this short fits in a std::string's inline buffer; its views must still point at
  // the tree's bytes after the tree moved out of the parser.
  auto o = parse(std::string("\x80\x02X\x03\x00\x00\x00" "abc.", 12));
  std::string other(4096, 'Z');  // reuse the stack and heap the parser left behind
  ASSERT_EQ(o->kind, Kind::Str);
  EXPECT_EQ(o->str(), "abc");
  auto moved = std::move(o);
  EXPECT_EQ(moved->str(), "abc");
}

TEST(PickleTest, ContainersAndInertCalls) {
  Writer w;
  w.global("torch", "Size");
  w.integer(4);
  w.integer(3);
  w.tuple(2);
  w.tuple(1);
  w.reduce();
  auto o = parse(w.finish());
  ASSERT_TRUE(o->calls("torch", "Size"));
  EXPECT_EQ(o->args()->items()[0]->items()[1]->i(), 3);

  Writer d;
  d.empty_dict();
  d.mark();
  d.str("a");
  d.empty_list();
  d.mark();
  d.integer(1);
  d.integer(2);
  d.appends();
  d.setitems();
  auto dict = parse(d.finish());
  ASSERT_EQ(dict->kind, Kind::Dict);
  ASSERT_EQ(dict->items().size(), 2u);
  EXPECT_EQ(dict->items()[1]->items().size(), 2u);
}

TEST(PickleTest, AskingAnObjectForWhatItsKindLacksGivesNothing) {
  // Kinds share an object's storage; an accessor of another kind must not read it. A tuple
  // (int, str, global, reduce, persistent id, float) exercises each pairing.
  Writer w;
  w.mark();
  w.integer(123456789);
  w.str("text");
  w.global("torch", "float32");
  w.global("torch", "Size");
  w.empty_tuple();
  w.reduce();
  w.integer(70000);
  w.binpersid();
  w.float64(2.5);
  w.tuple_from_mark();
  auto o = parse(w.finish());
  ASSERT_EQ(o->items().size(), 6u);
  const ObjectPtr integer = o->items()[0], text = o->items()[1], global = o->items()[2];
  const ObjectPtr call = o->items()[3], pid = o->items()[4], real = o->items()[5];

  EXPECT_EQ(integer->i(), 123456789);
  EXPECT_TRUE(integer->str().empty());
  EXPECT_TRUE(integer->items().empty());
  EXPECT_EQ(integer->callable(), nullptr);
  EXPECT_EQ(integer->args(), nullptr);
  EXPECT_EQ(integer->f(), 0.0);

  EXPECT_EQ(text->str(), "text");
  EXPECT_EQ(text->i(), 0);
  EXPECT_TRUE(text->name().empty());
  EXPECT_TRUE(text->items().empty());

  EXPECT_EQ(global->str(), "torch");
  EXPECT_EQ(global->name(), "float32");
  EXPECT_EQ(global->callable(), nullptr);
  EXPECT_EQ(global->state(), nullptr);
  EXPECT_TRUE(global->items().empty());

  ASSERT_TRUE(call->calls("torch", "Size"));
  EXPECT_TRUE(call->str().empty());
  EXPECT_TRUE(call->name().empty());
  EXPECT_EQ(call->i(), 0);
  EXPECT_EQ(call->state(), nullptr);

  ASSERT_EQ(pid->kind, Kind::PersId);
  EXPECT_EQ(pid->args()->i(), 70000);
  EXPECT_EQ(pid->callable(), nullptr);
  EXPECT_TRUE(pid->items().empty());

  EXPECT_EQ(real->f(), 2.5);
  EXPECT_EQ(real->i(), 0);
  EXPECT_TRUE(real->str().empty());
}

TEST(PickleTest, EqualIntsTuplesAndSizesAreSharedAndSizesCannotChange) {
  // torch.Size((70000, 3)) twice, without the memo: one object, like Python's equal tuples.
  Writer w;
  w.mark();
  for (int k = 0; k < 2; ++k) {
    w.global("torch", "Size");
    w.integer(70000);
    w.integer(3);
    w.tuple(2);
    w.tuple(1);
    w.reduce();
  }
  w.integer(70001);
  w.tuple_from_mark();
  auto o = parse(w.finish());
  ASSERT_EQ(o->items().size(), 3u);
  EXPECT_EQ(o->items()[0], o->items()[1]);
  EXPECT_TRUE(o->items()[0]->calls("torch", "Size"));
  EXPECT_EQ(o->items()[0]->args()->items()[0]->items()[0]->i(), 70000);
  EXPECT_EQ(o->items()[2]->i(), 70001);

  // Python cannot BUILD, SETITEMS or APPENDS on a torch.Size, and neither can this reader.
  for (char op : {'b', 'u', 'e'}) {
    Writer bad;
    bad.global("torch", "Size");
    bad.empty_tuple();
    bad.reduce();
    if (op == 'b') {
      bad.empty_dict();
      bad.build();
    } else {
      bad.mark();
      bad.integer(1);
      bad.integer(2);
      op == 'u' ? bad.setitems() : bad.appends();
    }
    try {
      parse(bad.finish());
      ADD_FAILURE() << op << ": no error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("on a torch.Size"), std::string::npos) << e.what();
    }
  }
}

TEST(PickleTest, ObjectsStaySmall) {
  // Tens of millions of objects make up a large '.metadata': each byte here is tens of MB.
  EXPECT_LE(sizeof(Object), 48u);
}

TEST(ArenaTest, HandsOutAlignedDisjointMemoryFromSmallAndMappedChunks) {
  Arena arena;
  std::vector<std::pair<char*, size_t>> blocks;
  // Small requests fill heap chunks; a 3 MiB one takes a mapped (huge-page) chunk.
  for (size_t n : {size_t{1}, size_t{48}, size_t{7}, size_t{3} << 20, size_t{24}, size_t{100000}}) {
    for (int k = 0; k < 50; ++k) {
      auto* p = static_cast<char*>(arena.allocate(n, 8));
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 8, 0u) << n;
      std::memset(p, static_cast<int>(blocks.size() & 0xff), n);
      blocks.emplace_back(p, n);
    }
  }
  // Every block still holds its own fill: none overlapped another.
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto [p, n] = blocks[b];
    ASSERT_EQ(static_cast<unsigned char>(p[0]), b & 0xff) << b;
    ASSERT_EQ(static_cast<unsigned char>(p[n - 1]), b & 0xff) << b;
  }
  EXPECT_GE(arena.reserved(), size_t{150} << 20);

  Arena moved = std::move(arena);
  EXPECT_EQ(arena.reserved(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(static_cast<unsigned char>(blocks.back().first[0]), (blocks.size() - 1) & 0xff);
  auto* fresh = static_cast<char*>(arena.allocate(16, 16));  // from a chunk of its own
  std::memset(fresh, 0xab, 16);
  EXPECT_EQ(static_cast<unsigned char>(blocks.back().first[0]), (blocks.size() - 1) & 0xff);
}

TEST(PickleTest, AViewTreePointsIntoTheCallersBytes) {
  Writer w;
  w.mark();
  w.str("fqn");
  w.global("torch", "Size");
  w.tuple_from_mark();
  const std::string bytes = w.finish();
  auto o = unpickle_view(bytes.data(), bytes.size(), "test");
  ASSERT_EQ(o->items().size(), 2u);
  const std::string_view fqn = o->items()[0]->str();
  EXPECT_EQ(fqn, "fqn");
  EXPECT_GE(fqn.data(), bytes.data());
  EXPECT_LT(fqn.data(), bytes.data() + bytes.size());
  EXPECT_EQ(o->items()[1]->name(), "Size");
  EXPECT_THROW(unpickle_view(bytes.data(), 0, "test"), c10::Error);
  EXPECT_THROW(unpickle_view(bytes.data(), bytes.size() - 1, "test"), c10::Error);  // no STOP
}

TEST(PickleTest, ReadsProtocol4FramesStackGlobalAndMemoize) {
  // pickle.dumps(collections.OrderedDict(a=1), protocol=4) as CPython 3.11 writes it.
  const std::string bytes("\x80\x04\x95\x29\x00\x00\x00\x00\x00\x00\x00\x8c\x0b\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x94\x8c\x0b\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x94\x93\x94\x29\x52\x94\x8c\x01\x61\x94\x4b\x01\x73\x2e", 52);
  auto o = parse(bytes);
  ASSERT_TRUE(o->calls("collections", "OrderedDict"));
  ASSERT_EQ(o->items().size(), 2u);
  EXPECT_EQ(o->items()[0]->str(), "a");
  EXPECT_EQ(o->items()[1]->i(), 1);
}

TEST(PickleTest, ContainersGrowAcrossBatchesAndSparseMemoIndicesWork) {
  // A list filled by three APPENDS batches (as Python batches by 1000), memoized under a
  // large LONG_BINPUT index and fetched again.
  std::string b("\x80\x02]", 3);
  for (int batch = 0; batch < 3; ++batch) {
    b += '(';
    for (int k = 0; k < 1000; ++k) {
      const int v = batch * 1000 + k;
      b += 'M';
      b += static_cast<char>(v & 0xff);
      b += static_cast<char>(v >> 8);
    }
    b += 'e';
  }
  b += std::string("r\xf0\xff\xff\xff" "0" "j\xf0\xff\xff\xff" ".", 12);  // PUT, POP, GET
  auto o = parse(b);
  ASSERT_EQ(o->kind, Kind::List);
  ASSERT_EQ(o->items().size(), 3000u);
  for (int v = 0; v < 3000; ++v) ASSERT_EQ(o->items()[v]->i(), v) << v;

  // MEMOIZE stores under len(memo), as Python's unpickler: after BINPUT 5 that is key 1.
  auto m = parse(std::string("\x80\x04K\x07q\x05" "0" "K\x08\x94" "0" "h\x01.", 14));
  ASSERT_EQ(m->kind, Kind::Int);
  EXPECT_EQ(m->i(), 8);
}

TEST(PickleTest, ASparseMemoKeyStaysFoundWhenTheDenseKeysGrowPastIt) {
  // Key 2000 is stored while the memo is empty (kept aside as sparse), then keys 0-1999 and
  // 2001 make the dense range cover it; 2000 is stored again. As in Python: GET 2000 finds
  // the new value, and MEMOIZE uses len(memo) = 2002 keys.
  auto u32 = [](uint32_t v) {
    return std::string{static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 24)};
  };
  std::string b("\x80\x04K\x2ar", 5);
  b += u32(2000) + "0";
  for (uint32_t k = 0; k <= 2001; ++k) {
    if (k != 2000) b += "Nr" + u32(k) + "0";
  }
  b += "j" + u32(2000) + "0";      // found while the dense range covers it
  b += "K\x2br" + u32(2000) + "0";  // stored again: replaces, adds no key
  b += "K\x07\x94" "0";           // MEMOIZE: key 2002
  b += "j" + u32(2000) + "j" + u32(2002) + "\x86.";
  auto o = parse(b);
  ASSERT_EQ(o->kind, Kind::Tuple);
  ASSERT_EQ(o->items().size(), 2u);
  EXPECT_EQ(o->items()[0]->i(), 0x2b);
  EXPECT_EQ(o->items()[1]->i(), 7);
}

TEST(PickleTest, SharedConstantsAreNeverMutated) {
  // (), None and small ints may be one shared object: SETITEMS/APPENDS/BUILD on them fail.
  for (const auto& bytes : {std::string("\x80\x02)(K\x01K\x02u.", 10),
                            std::string("\x80\x02)(K\x01e.", 8),
                            std::string("\x80\x02K\x01Nb.", 7)}) {
    EXPECT_THROW(parse(bytes), c10::Error);
  }
  auto o = parse(std::string("\x80\x02(K\x07)NK\x07t.", 11));
  ASSERT_EQ(o->items().size(), 4u);
  EXPECT_EQ(o->items()[0]->i(), 7);
  EXPECT_EQ(o->items()[1]->kind, Kind::Tuple);
  EXPECT_TRUE(o->items()[1]->items().empty());
  EXPECT_EQ(o->items()[2]->kind, Kind::None);
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* expected;
};

TEST(PickleTest, MalformedInputRaisesNamingSourceAndOffset) {
  const std::vector<Malformed> cases = {
      {"empty", "", "empty"},
      {"truncated int", std::string("\x80\x02J\x01\x02", 5), "truncated"},
      {"no stop", std::string("\x80\x02K\x01", 4), "truncated"},
      {"unknown opcode", std::string("\x80\x02\xff.", 4), "unknown opcode"},
      {"INST is not allowed", std::string("\x80\x02iox\nsystem\n.", 15), "opcode"},
      {"stack underflow", std::string("\x80\x02s.", 4), "stack underflow"},
      {"bad memo", std::string("\x80\x02h\x05.", 5), "memo key 5"},
      {"two values at stop", std::string("\x80\x02NN.", 5), "STOP with 2"},
      {"reduce of a non-global", std::string("\x80\x02K\x01)R.", 6), "only named globals"},
      {"huge string length", std::string("\x80\x02X\xff\xff\xff\x7f", 7), "truncated"},
      {"pop below mark", std::string("\x80\x02N(0.", 6), "stack underflow"},
      {"setitems without mark", std::string("\x80\x02}u.", 5), "no MARK"},
      {"long too wide", std::string("\x80\x02\x8a\x09") + std::string(9, '\x01') + ".",
       "does not fit"},
  };
  for (const auto& c : cases) {
    try {
      parse(c.bytes);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("test"), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find(c.expected), std::string::npos) << c.name << ": " << msg;
    }
  }
}

}  // namespace
}  // namespace dcp::detail::pickle
