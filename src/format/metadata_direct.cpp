// The direct '.metadata' decoder: the pickle of Python's Metadata dataclasses read straight into
// a dcp::Metadata, without the restricted reader's object tree (format/pickle.h). At scale the
// tree is the cost: a '.metadata' of 2 million chunks is some 24 million objects (1.2 GiB),
// built, then walked once and dropped.
//
// It is a recursive-descent parser over the opcodes that dcp's encoder and Python's pickler
// (protocols 2 to 5) emit for these dataclasses. Each rule consumes opcodes with exactly the
// stack effect the pickle machine would give them (a value rule: one value pushed; a dict's
// entries: MARK k v ... SETITEMS or k v SETITEM onto the dict below), so whatever it accepts is
// what the machine would build, and the tree decoder would read the same Metadata from it.
// Anything else gives up (GiveUp), and decode_metadata falls back to the tree decoder, which
// decodes or refuses the input with its own messages: a memo reference to a value this parser
// does not track, an unknown field or global, an OrderedDict, a pathlib part that is not a
// str, a non-sequential memo key, an expansion past the budget (charged as the tree charges),
// and every form of corruption. Giving up is always safe; accepting is what must be right, and
// tests/fuzz/fuzz_metadata.cpp compares the two decoders on every input it makes.
//
// Where a container ends is not marked in a pickle: after a dict's last lone `k v SETITEM` or a
// list's last `v APPEND`, the next value belongs to whatever holds the container. There the
// parser tries one more entry and, if that fails, rewinds (input position, memo, int pool,
// budget) and returns: attempt().
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/dtypes.h"
#include "format/metadata_codec.h"
#include "format/metadata_schema.h"
#include "format/pickle.h"
#include "storage_data.h"

namespace dcp::detail {
namespace {

using namespace metadata_schema;  // NOLINT(google-build-using-namespace): the format's names
using Op = pickle::PickleOpCode;

struct GiveUp {};

// What the parser knows of a memoized value: enough to push it again where a rule accepts it.
enum class Tag : uint8_t {
  kOther,      // a value no rule takes from the memo (dicts, lists, instances, argument tuples)
  kStr,        // text, n
  kGlobal,     // i: index into globals_
  kInt,        // i
  kBool,       // i
  kNone,
  kInts,       // a tuple of ints: pool_[i, i + n)
  kSize,       // torch.Size(tuple of ints): pool_[i, i + n)
  kStrided,    // torch.serialization._get_layout('torch.strided')
  kMemFormat,  // _MEM_FORMAT_ENCODING(i) (any callable of one int, as the tree reads it)
};
struct Value {
  Tag tag = Tag::kOther;
  uint32_t n = 0;
  union {
    const char* text;
    int64_t i = 0;
  };
  static Value str(std::string_view s) {
    Value v;
    v.tag = Tag::kStr;
    v.n = static_cast<uint32_t>(s.size());
    v.text = s.data();
    return v;
  }
  static Value of(Tag tag, int64_t i = 0, uint32_t n = 0) {
    Value v;
    v.tag = tag;
    v.i = i;
    v.n = n;
    return v;
  }
};
static_assert(sizeof(Value) == 16, "one per memo key: Python memoizes every object");

// The globals the rules ask for by name, told apart once per global read rather than by
// string compares at each of the millions of references to them.
enum class Known : uint8_t {
  kOther,
  kMetadata,
  kTensorStorageMetadata,
  kBytesStorageMetadata,
  kTensorProperties,  // either module
  kChunkStorageMetadata,
  kMetadataIndex,
  kStorageInfo,
  kStorageMeta,
  kTorchSize,
  kGetLayout,  // torch.serialization._get_layout
};

struct Global {
  std::string_view module, name;
  Known known = Known::kOther;

  static Known classify(std::string_view module, std::string_view name) {
    if (module == kMetadataModule) {
      if (name == "Metadata") return Known::kMetadata;
      if (name == "TensorStorageMetadata") return Known::kTensorStorageMetadata;
      if (name == "BytesStorageMetadata") return Known::kBytesStorageMetadata;
      if (name == "TensorProperties") return Known::kTensorProperties;
      if (name == "ChunkStorageMetadata") return Known::kChunkStorageMetadata;
      if (name == "MetadataIndex") return Known::kMetadataIndex;
      if (name == "StorageMeta") return Known::kStorageMeta;
    } else if (module == kLegacyMetadataModule) {
      if (name == "TensorProperties") return Known::kTensorProperties;
    } else if (module == kFilesystemModule) {
      if (name == "_StorageInfo") return Known::kStorageInfo;
    } else if (module == "torch") {
      if (name == "Size") return Known::kTorchSize;
    } else if (module == "torch.serialization") {
      if (name == "_get_layout") return Known::kGetLayout;
    }
    return Known::kOther;
  }
};

// A tuple of ints in pool_.
struct Ints {
  size_t begin = 0;
  uint32_t n = 0;
};

constexpr uint8_t code(Op op) { return static_cast<uint8_t>(op); }
// Items of a tuple that is not a shape (a planner path, a pathlib path's parts): its count is a
// uint32_t, as the tree's.
constexpr size_t kMaxItems = UINT32_MAX - 1;

class DirectDecoder {
 public:
  DirectDecoder(const char* data, size_t size)
      : p_(reinterpret_cast<const uint8_t*>(data)),
        end_(p_ + size),
        budget_(budget_for(size)) {}

  Metadata decode() {
    if (p_ < end_ && *p_ == code(Op::PROTO)) {
      ++p_;
      const uint64_t protocol = le(1);
      need(protocol <= 5);
      // FRAME exists from protocol 4 on; in an older pickle one gives up (no rule takes it),
      // and the cursor need not look for it before every opcode.
      frames_ = protocol >= 4;
    }
    need(instance_header() == Known::kMetadata);
    Metadata md;
    uint32_t seen = 0;
    fields([&](std::string_view field) {
      if (field == "state_dict_metadata") {
        once(seen, 1);
        state_dict_metadata(md);
      } else if (field == "planner_data") {
        once(seen, 2);
        md.planner_data.reset();
        if (!none()) md.planner_data = planner_data();
      } else if (field == "storage_data") {
        once(seen, 4);
        if (!none()) md.storage_data = storage_data(expected_entries(md));
      } else if (field == "storage_meta") {
        once(seen, 8);
        md.storage_meta.reset();
        if (!none()) md.storage_meta = storage_meta();
      } else if (field == "version") {
        once(seen, 16);
        md.version.reset();
        if (!none()) md.version = std::string(str());
      } else {
        give_up();
      }
    });
    expect(Op::STOP);
    need(seen & 1);
    return md;
  }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] static void give_up() { throw GiveUp{}; }
  static void need(bool ok) {
    if (!ok) give_up();
  }
  // A field may appear once (the tree would take the last; no writer repeats one).
  static void once(uint32_t& seen, uint32_t bit) {
    need((seen & bit) == 0);
    seen |= bit;
  }

  // ---- bytes and opcodes

  // The next opcode, past any FRAME (a buffering hint the machine skips wherever it is).
  [[gnu::always_inline]] uint8_t peek() {
    need(p_ < end_);
    if (frames_ && *p_ == code(Op::FRAME)) skip_frames();
    return *p_;
  }
  [[gnu::noinline]] void skip_frames() {
    while (p_ < end_ && *p_ == code(Op::FRAME)) {
      need(end_ - p_ >= 9);
      p_ += 9;
    }
    need(p_ < end_);
  }
  [[gnu::always_inline]] bool accept(Op op) {
    if (peek() != code(op)) return false;
    ++p_;
    return true;
  }
  [[gnu::always_inline]] void expect(Op op) { need(accept(op)); }
  const uint8_t* take(uint64_t n) {
    need(n <= static_cast<uint64_t>(end_ - p_));
    const uint8_t* q = p_;
    p_ += n;
    return q;
  }
  uint64_t le(int n) {
    const uint8_t* q = take(n);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | q[k];
    return v;
  }
  std::string_view line() {
    const void* nl = std::memchr(p_, '\n', end_ - p_);
    need(nl != nullptr);
    const auto* q = static_cast<const uint8_t*>(nl);
    std::string_view s(reinterpret_cast<const char*>(p_), q - p_);
    p_ = q + 1;
    return s;
  }

  // ---- the memo

  // Stores `v` under the memo keys that follow the opcode that pushed it. Python's keys and
  // dcp's run 0, 1, 2, ...; any other order gives up (so rewinding is truncating).
  [[gnu::always_inline]] void memo(const Value& v) {
    // Most values have no memo key (dcp memoizes only strings and globals): one compare.
    if (p_ < end_ && *p_ != code(Op::BINPUT) && *p_ != code(Op::MEMOIZE) &&
        *p_ != code(Op::LONG_BINPUT) && *p_ != code(Op::FRAME)) {
      return;
    }
    memo_keys(v);
  }
  [[gnu::noinline]] void memo_keys(const Value& v) {
    while (true) {
      const uint8_t c = peek();
      uint64_t key;
      if (c == code(Op::BINPUT)) {
        ++p_;
        key = le(1);
      } else if (c == code(Op::LONG_BINPUT)) {
        ++p_;
        key = le(4);
      } else if (c == code(Op::MEMOIZE)) {
        ++p_;
        key = memo_.size();
      } else {
        return;
      }
      need(key == memo_.size());
      memo_.push_back(v);
    }
  }
  // The memo entry a BINGET/LONG_BINGET at the cursor would push, without consuming it.
  [[gnu::always_inline]] const Value* peek_memo() {
    const uint8_t c = peek();
    uint64_t key;
    if (c == code(Op::BINGET)) {
      need(end_ - p_ >= 2);
      key = p_[1];
    } else if (c == code(Op::LONG_BINGET)) {
      need(end_ - p_ >= 5);
      key = uint64_t{p_[1]} | uint64_t{p_[2]} << 8 | uint64_t{p_[3]} << 16 | uint64_t{p_[4]} << 24;
    } else {
      return nullptr;
    }
    need(key < memo_.size());
    return &memo_[key];
  }
  // Consumes the memo get at the cursor, whose entry peek_memo() gave as `v`, and any memo keys
  // after it; returns the value it pushes.
  [[gnu::always_inline]] Value take_memo(const Value* v) {
    const Value value = *v;  // memo() below may move memo_
    p_ += *p_ == code(Op::BINGET) ? 2 : 5;
    memo(value);
    return value;
  }
  // If the cursor is at a memo get of a value tagged `tag`: consumes it and returns the value.
  [[gnu::always_inline]] std::optional<Value> got(Tag tag) {
    const Value* v = peek_memo();
    if (v == nullptr || v->tag != tag) return std::nullopt;
    return take_memo(v);
  }
  // The same where the cursor must be at one (a BINGET/LONG_BINGET case of a rule's switch).
  [[gnu::always_inline]] Value memo_get(Tag tag) {
    const Value* v = peek_memo();
    need(v != nullptr && v->tag == tag);
    return take_memo(v);
  }
  // What the value at the cursor is, where one opcode says so.
  Tag next_tag() {
    if (const Value* v = peek_memo()) return v->tag;
    switch (static_cast<Op>(peek())) {
      case Op::SHORT_BINUNICODE:
      case Op::BINUNICODE:
      case Op::BINUNICODE8:
      case Op::SHORT_BINSTRING:
      case Op::BINSTRING:
        return Tag::kStr;
      case Op::BININT:
      case Op::BININT1:
      case Op::BININT2:
      case Op::LONG1:
      case Op::LONG4:
        return Tag::kInt;
      default:
        return Tag::kOther;
    }
  }

  // ---- rewinding

  struct Mark {
    const uint8_t* p;
    size_t memo, pool, globals;
    uint64_t spent;
  };
  // f(), or, where it gives up, nullopt with everything as it was before.
  template <typename F>
  auto attempt(F&& f) -> std::optional<decltype(f())> {
    const Mark mark{p_, memo_.size(), pool_.size(), globals_.size(), spent_};
    try {
      return f();
    } catch (const GiveUp&) {
      p_ = mark.p;
      memo_.resize(mark.memo);
      pool_.resize(mark.pool);
      globals_.resize(mark.globals);
      spent_ = mark.spent;
      return std::nullopt;
    }
  }
  // Whether the cursor is at an opcode that closes whatever holds a container (so no entry of
  // the container can start there): spares an attempt at every container's end.
  bool at_closer() {
    const uint8_t c = peek();
    return c == code(Op::SETITEMS) || c == code(Op::SETITEM) || c == code(Op::BUILD) ||
           c == code(Op::APPENDS) || c == code(Op::APPEND) || c == code(Op::STOP);
  }

  // ---- the budget (metadata_schema.h)

  void charge(uint64_t bytes) {
    spent_ += bytes;
    need(spent_ <= budget_);
  }

  // ---- values

  std::string_view str() {
    uint64_t n;
    switch (static_cast<Op>(peek())) {
      case Op::BINGET:
      case Op::LONG_BINGET: {
        const Value v = memo_get(Tag::kStr);
        return {v.text, v.n};
      }
      case Op::SHORT_BINUNICODE:
      case Op::SHORT_BINSTRING:
        ++p_;
        n = le(1);
        break;
      case Op::BINUNICODE:
      case Op::BINSTRING:
        ++p_;
        n = le(4);
        break;
      case Op::BINUNICODE8:
        ++p_;
        n = le(8);
        break;
      default:
        give_up();
    }
    need(n <= UINT32_MAX);
    const std::string_view s(reinterpret_cast<const char*>(take(n)), n);
    memo(Value::str(s));
    return s;
  }
  // A str the Metadata keeps, charged as the tree charges it.
  std::string owned_str() {
    const std::string_view s = str();
    charge(kStrCharge + s.size());
    return std::string(s);
  }

  Global global() {
    if (auto v = got(Tag::kGlobal)) return globals_[v->i];
    Global g;
    if (accept(Op::GLOBAL)) {
      g.module = line();
      g.name = line();
    } else {
      g.module = str();
      g.name = str();
      expect(Op::STACK_GLOBAL);
    }
    need(g.module.size() <= UINT32_MAX && g.name.size() <= UINT32_MAX);
    g.known = Global::classify(g.module, g.name);
    globals_.push_back(g);
    memo(Value::of(Tag::kGlobal, static_cast<int64_t>(globals_.size() - 1)));
    return g;
  }

  int64_t integer() {
    int64_t i;
    switch (static_cast<Op>(peek())) {
      case Op::BINGET:
      case Op::LONG_BINGET:
        return memo_get(Tag::kInt).i;
      case Op::BININT1:
        ++p_;
        i = static_cast<int64_t>(le(1));
        break;
      case Op::BININT2:
        ++p_;
        i = static_cast<int64_t>(le(2));
        break;
      case Op::BININT:
        ++p_;
        i = static_cast<int32_t>(le(4));
        break;
      case Op::LONG1:
        ++p_;
        i = long_bytes(le(1));
        break;
      case Op::LONG4:
        ++p_;
        i = long_bytes(le(4));
        break;
      default:
        give_up();
    }
    memo(Value::of(Tag::kInt, i));
    return i;
  }
  // A little-endian two's-complement int of n bytes; wider than 64 bits gives up (the tree
  // refuses it with its message).
  int64_t long_bytes(uint64_t n) {
    need(n <= 8);
    const uint8_t* q = take(n);
    uint64_t v = 0;
    for (uint64_t k = n; k-- > 0;) v = (v << 8) | q[k];
    if (n > 0 && n < 8 && (q[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(v);
  }

  bool boolean() {
    if (auto v = got(Tag::kBool)) return v->i != 0;
    const bool b = peek() == code(Op::NEWTRUE);
    need(b || peek() == code(Op::NEWFALSE));
    ++p_;
    memo(Value::of(Tag::kBool, b));
    return b;
  }

  // Consumes a None if the cursor is at one.
  bool none() {
    if (got(Tag::kNone)) return true;
    if (!accept(Op::NONE)) return false;
    memo(Value::of(Tag::kNone));
    return true;
  }

  // The n values a tuple rule reads: TUPLE1-3 after 1-3 of them, or MARK ... TUPLE, or
  // EMPTY_TUPLE. `item(k)` reads the k-th; `more()` says whether another starts at the cursor
  // (the TUPLE1-3 forms only). At most `max_items`. Returns the count; the caller memoizes.
  template <typename Item, typename More>
  uint32_t tuple_items(size_t max_items, Item&& item, More&& more) {
    if (accept(Op::EMPTY_TUPLE)) return 0;
    uint32_t n = 0;
    if (accept(Op::MARK)) {
      while (!accept(Op::TUPLE)) {
        need(n < max_items);
        item(n++);
      }
      return n;
    }
    while (n < 3 && n < max_items && more()) item(n++);
    need(n > 0);
    expect(static_cast<Op>(code(Op::TUPLE1) + n - 1));
    return n;
  }

  // A tuple of ints, into pool_.
  Ints ints_tuple() {
    if (auto v = got(Tag::kInts)) return {static_cast<size_t>(v->i), v->n};
    Ints r{pool_.size(), 0};
    r.n = tuple_items(
        kMaxDims, [&](uint32_t) { pool_.push_back(integer()); },
        [&] { return next_tag() == Tag::kInt; });
    memo(Value::of(Tag::kInts, static_cast<int64_t>(r.begin), r.n));
    return r;
  }

  // torch.Size((ints...)), or a plain tuple of ints (the tree takes either as a shape),
  // charged as the tree charges each shape.
  Dims shape() {
    const size_t pool_size = pool_.size(), memo_size = memo_.size();
    Ints r;
    switch (static_cast<Op>(peek())) {
      case Op::BINGET:
      case Op::LONG_BINGET: {
        const Value* m = peek_memo();
        if (m->tag == Tag::kSize || m->tag == Tag::kInts) {
          const Value v = take_memo(m);
          r = {static_cast<size_t>(v.i), v.n};
        } else {
          r = size_call();  // a memoized torch.Size global, or a module name
        }
        break;
      }
      case Op::GLOBAL:
      case Op::SHORT_BINUNICODE:
      case Op::BINUNICODE:
      case Op::BINUNICODE8:
      case Op::SHORT_BINSTRING:
      case Op::BINSTRING:
        r = size_call();
        break;
      default:
        r = ints_tuple();  // EMPTY_TUPLE, MARK or an int: a plain tuple
    }
    need(r.n <= kMaxDims);
    charge(shape_charge(r.n));
    Dims dims(pool_.begin() + r.begin, pool_.begin() + r.begin + r.n);
    // A tuple no memo key refers to is not needed again: the pool keeps only memoized ones
    // (Python memoizes every tuple, dcp none).
    if (memo_.size() == memo_size) pool_.resize(pool_size);
    return dims;
  }

  // torch.Size(tuple of ints), by REDUCE.
  Ints size_call() {
    need(known_global() == Known::kTorchSize);
    const Ints r = ints_tuple();
    expect(Op::TUPLE1);
    memo(Value());
    expect(Op::REDUCE);
    memo(Value::of(Tag::kSize, static_cast<int64_t>(r.begin), r.n));
    return r;
  }

  // Which known global the cursor's global is (the common case, a memo get, without copying
  // the Global).
  Known known_global() {
    const Value* v = peek_memo();
    if (v != nullptr && v->tag == Tag::kGlobal) return globals_[take_memo(v).i].known;
    return global().known;
  }

  // GLOBAL/STACK_GLOBAL, EMPTY_TUPLE, NEWOBJ: a dataclass instance before its BUILD; returns
  // its class.
  Known instance_header() {
    const Known cls = known_global();
    expect(Op::EMPTY_TUPLE);
    expect(Op::NEWOBJ);
    memo(Value());
    return cls;
  }

  // A dataclass's state, a dict of its fields, and the BUILD that applies it: field(name) reads
  // each field's value.
  template <typename F>
  void fields(F&& field) {
    expect(Op::EMPTY_DICT);
    memo(Value());
    while (true) {
      if (accept(Op::MARK)) {
        while (!accept(Op::SETITEMS)) field(str());
        continue;
      }
      if (accept(Op::BUILD)) return;
      field(str());
      expect(Op::SETITEM);
    }
  }

  // The entries of the dict or list just pushed (its EMPTY_DICT/EMPTY_LIST and memo keys read):
  // batches of MARK ... SETITEMS/APPENDS, and lone entries closed by SETITEM/APPEND. entry()
  // reads one (a key and a value, or an item) and returns it; add() takes it.
  template <typename Entry, typename Add>
  void entries(Op batch_end, Op lone_end, Entry&& entry, Add&& add) {
    while (true) {
      if (accept(Op::MARK)) {
        while (!accept(batch_end)) add(entry());
        continue;
      }
      if (at_closer()) return;
      auto e = attempt([&] {
        auto value = entry();
        expect(lone_end);
        return value;
      });
      if (!e) return;
      add(std::move(*e));
    }
  }
  template <typename Entry, typename Add>
  void dict_entries(Entry&& entry, Add&& add) {
    expect(Op::EMPTY_DICT);
    memo(Value());
    entries(Op::SETITEMS, Op::SETITEM, entry, add);
  }
  template <typename Item, typename Add>
  void list_items(Item&& item, Add&& add) {
    expect(Op::EMPTY_LIST);
    memo(Value());
    entries(Op::APPENDS, Op::APPEND, item, add);
  }

  // ---- the dataclasses

  void state_dict_metadata(Metadata& md) {
    dict_entries(
        [&] {
          std::string fqn = owned_str();
          StorageMetadata value = storage_metadata();
          return std::make_pair(std::move(fqn), std::move(value));
        },
        [&](std::pair<std::string, StorageMetadata>&& e) {
          md.state_dict_metadata.insert_or_assign(std::move(e.first), std::move(e.second));
        });
  }

  StorageMetadata storage_metadata() {
    const Known cls = instance_header();
    if (cls == Known::kBytesStorageMetadata) {
      if (peek() == code(Op::EMPTY_DICT)) fields([](std::string_view) { give_up(); });
      return BytesStorageMetadata{};
    }
    need(cls == Known::kTensorStorageMetadata);
    TensorStorageMetadata t;
    uint32_t seen = 0;
    fields([&](std::string_view field) {
      if (field == "properties") {
        once(seen, 1);
        t.properties = properties();
      } else if (field == "size") {
        once(seen, 2);
        t.size = shape();
      } else if (field == "chunks") {
        once(seen, 4);
        // Tensors of one checkpoint mostly have as many chunks as the last one (one per rank):
        // room for that many spares the vector's regrowth; a list far shorter gives it back.
        t.chunks.clear();
        t.chunks.reserve(chunks_hint_);
        list_items([&] { return chunk(); },
                   [&](ChunkStorageMetadata&& c) { t.chunks.push_back(std::move(c)); });
        if (t.chunks.size() < t.chunks.capacity() / 2) t.chunks.shrink_to_fit();
        chunks_hint_ = t.chunks.size();
      } else {
        give_up();
      }
    });
    need(seen == 7);
    for (const auto& c : t.chunks) {
      need(c.offsets.size() == t.size.size() && c.sizes.size() == t.size.size());
    }
    return t;
  }

  // The 5-tuple state Python's TensorProperties.__getstate__ gives (the legacy dict form gives
  // up: the tree reads it).
  TensorProperties properties() {
    need(instance_header() == Known::kTensorProperties);
    TensorProperties p;
    expect(Op::MARK);
    const Global dtype = global();
    need(dtype.module == "torch");
    const auto dt = dtype_from_python_name(std::string(dtype.name));
    need(dt.has_value());
    p.dtype = *dt;
    layout();
    p.requires_grad = boolean();
    p.memory_format = static_cast<MemFormatEncoding>(memory_format());
    p.pin_memory = boolean();
    expect(Op::TUPLE);
    memo(Value());
    expect(Op::BUILD);
    return p;
  }
  // torch.strided: the global 'torch strided', or torch.serialization._get_layout('torch.strided').
  void layout() {
    if (got(Tag::kStrided)) return;
    const Global g = global();
    if (g.module == "torch") {
      need(g.name == "strided");
      return;
    }
    need(g.known == Known::kGetLayout);
    const std::string_view name = str();
    expect(Op::TUPLE1);
    memo(Value());
    expect(Op::REDUCE);
    need(name == "torch.strided");
    memo(Value::of(Tag::kStrided));
  }
  int64_t memory_format() {
    if (auto v = got(Tag::kMemFormat)) return v->i;
    global();
    const int64_t i = integer();
    expect(Op::TUPLE1);
    memo(Value());
    expect(Op::REDUCE);
    memo(Value::of(Tag::kMemFormat, i));
    return i;
  }

  ChunkStorageMetadata chunk() {
    need(instance_header() == Known::kChunkStorageMetadata);
    ChunkStorageMetadata c;
    uint32_t seen = 0;
    fields([&](std::string_view field) {
      if (field == "offsets") {
        once(seen, 1);
        c.offsets = shape();
      } else if (field == "sizes") {
        once(seen, 2);
        c.sizes = shape();
      } else {
        give_up();
      }
    });
    need(seen == 3);
    return c;
  }

  // One storage entry per chunk and per byte item, if the file is consistent. The decoded
  // chunks and keys hold memory already, and the room reserved (176 bytes an entry) is at
  // most a few times theirs (96 bytes a chunk, more for a key), so a hostile file gains
  // little by it.
  static size_t expected_entries(const Metadata& md) {
    size_t n = 0;
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      const auto* tensor = std::get_if<TensorStorageMetadata>(&entry);
      n += tensor != nullptr ? tensor->chunks.size() : 1;
    }
    return n;
  }

  StorageData storage_data(size_t expected) {
    StorageDataBuilder out(expected);
    dict_entries(
        [&] {
          MetadataIndex index = metadata_index();
          StorageInfo info = storage_info();
          return std::make_pair(std::move(index), std::move(info));
        },
        [&](std::pair<MetadataIndex, StorageInfo>&& e) {
          out.add(std::move(e.first), std::move(e.second));
        });
    return std::move(out).finish();
  }

  MetadataIndex metadata_index() {
    need(instance_header() == Known::kMetadataIndex);
    MetadataIndex index;
    uint32_t seen = 0;
    fields([&](std::string_view field) {
      if (field == "fqn") {
        once(seen, 1);
        index.fqn = owned_str();
      } else if (field == "offset") {
        once(seen, 2);
        if (!none()) index.offset = shape();
      } else if (field == "index") {
        once(seen, 4);
        if (!none()) index.index = integer();
      } else {
        give_up();
      }
    });
    need(seen & 1);
    return index;
  }

  StorageInfo storage_info() {
    need(instance_header() == Known::kStorageInfo);
    StorageInfo info;
    uint32_t seen = 0;
    fields([&](std::string_view field) {
      if (field == "relative_path") {
        once(seen, 1);
        info.relative_path = owned_str();
      } else if (field == "offset") {
        once(seen, 2);
        info.offset = integer();
      } else if (field == "length") {
        once(seen, 4);
        info.length = integer();
      } else if (field == "transform_descriptors") {
        once(seen, 8);
        if (none()) return;
        list_items([&] { return owned_str(); },
                   [&](std::string&& d) { info.transform_descriptors.push_back(std::move(d)); });
      } else {
        give_up();
      }
    });
    need((seen & 7) == 7 && info.offset >= 0 && info.length >= 0);
    return info;
  }

  std::map<std::string, ObjectPath> planner_data() {
    std::map<std::string, ObjectPath> out;
    dict_entries(
        [&] {
          std::string key(str());
          ObjectPath path;
          tuple_items(
              kMaxItems,
              [&](uint32_t) {
                if (next_tag() == Tag::kStr) {
                  const std::string_view s = str();
                  charge(kStrCharge + s.size());
                  path.emplace_back(std::string(s));
                } else {
                  charge(kStrCharge);
                  path.emplace_back(integer());
                }
              },
              [&] {
                const Tag t = next_tag();
                return t == Tag::kStr || t == Tag::kInt;
              });
          memo(Value());
          return std::make_pair(std::move(key), std::move(path));
        },
        [&](std::pair<std::string, ObjectPath>&& e) {
          out.insert_or_assign(out.end(), std::move(e.first), std::move(e.second));
        });
    return out;
  }

  StorageMeta storage_meta() {
    need(instance_header() == Known::kStorageMeta);
    StorageMeta meta;
    uint32_t seen = 0;
    fields([&](std::string_view field) {
      if (field == "checkpoint_id") {
        once(seen, 1);
        meta.checkpoint_id = text();
      } else if (field == "save_id") {
        once(seen, 2);
        meta.save_id = text();
      } else if (field == "load_id") {
        once(seen, 4);
        meta.load_id = text();
      } else if (field == "modules") {
        once(seen, 8);
        meta.modules.clear();
        list_items([&] { return std::string(str()); },
                   [&](std::string&& m) { meta.modules.push_back(std::move(m)); });
      } else {
        give_up();
      }
    });
    return meta;
  }
  // StorageMeta's ids: None, a str, or a pathlib path (its parts joined with '/', as the tree
  // joins them).
  std::optional<std::string> text() {
    if (none()) return std::nullopt;
    // A str first might be a path's module ('pathlib' 'PosixPath' STACK_GLOBAL).
    if (auto path = attempt([&] { return pathlib_path(); })) return std::move(*path);
    return std::string(str());
  }
  std::string pathlib_path() {
    need(is_pathlib_module(global().module));
    std::string path;
    tuple_items(
        kMaxItems, [&](uint32_t) { append_path_part(path, str()); },
        [&] { return next_tag() == Tag::kStr; });
    memo(Value());
    expect(Op::REDUCE);
    memo(Value());
    return path;
  }

  const uint8_t* p_;
  const uint8_t* const end_;
  const uint64_t budget_;
  uint64_t spent_ = 0;
  bool frames_ = true;  // FRAME opcodes may appear (protocol 4 and up, or no PROTO)
  std::vector<Value> memo_;
  std::vector<int64_t> pool_;  // the items of every tuple of ints read
  std::vector<Global> globals_;
  size_t chunks_hint_ = 0;  // the last tensor's chunk count
};

}  // namespace

std::optional<Metadata> decode_metadata_direct(const char* data, size_t size) {
  try {
    return DirectDecoder(data, size).decode();
  } catch (const GiveUp&) {
    return std::nullopt;
  }
}

}  // namespace dcp::detail
