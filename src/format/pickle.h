// A restricted Python pickle reader and a small pickle writer.
//
// The reader runs the pickle machine over a closed set of opcodes (protocols 2 to 5) and builds
// a tree of inert Objects: GLOBAL becomes a named reference, REDUCE/NEWOBJ/BUILD become records
// of "call this with these arguments" that nothing ever executes. Callers (the metadata codec,
// the torch.save record reader) interpret the tree and reject whatever they do not know. Any
// malformed input raises c10::Error naming the source and byte offset; nothing is executed.
//
// The writer emits protocol 2 (what torch.save's data.pkl uses and what every pickle.load
// accepts), with the memo used for repeated strings and globals.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "format/arena.h"

namespace dcp::detail::pickle {

/// Pickle opcodes, named as in Python's pickletools and PyTorch's own PickleOpCode.
enum class PickleOpCode : uint8_t {
  MARK = '(',
  STOP = '.',
  POP = '0',
  POP_MARK = '1',
  DUP = '2',
  FLOAT = 'F',
  INT = 'I',
  BININT = 'J',
  BININT1 = 'K',
  LONG = 'L',
  BININT2 = 'M',
  NONE = 'N',
  PERSID = 'P',
  BINPERSID = 'Q',
  REDUCE = 'R',
  STRING = 'S',
  BINSTRING = 'T',
  SHORT_BINSTRING = 'U',
  UNICODE = 'V',
  BINUNICODE = 'X',
  APPEND = 'a',
  BUILD = 'b',
  GLOBAL = 'c',
  DICT = 'd',
  EMPTY_DICT = '}',
  APPENDS = 'e',
  GET = 'g',
  BINGET = 'h',
  INST = 'i',
  LONG_BINGET = 'j',
  LIST = 'l',
  EMPTY_LIST = ']',
  OBJ = 'o',
  PUT = 'p',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  EMPTY_TUPLE = ')',
  SETITEMS = 'u',
  BINFLOAT = 'G',
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  PROTO = 0x80,
  NEWOBJ = 0x81,
  EXT1 = 0x82,
  EXT2 = 0x83,
  EXT4 = 0x84,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  EMPTY_SET = 0x8f,
  ADDITEMS = 0x90,
  FROZENSET = 0x91,
  NEWOBJ_EX = 0x92,
  STACK_GLOBAL = 0x93,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

struct Object;
class Machine;
/// Objects live in the Tree that unpickle() returns and die with it.
using ObjectPtr = const Object*;

enum class Kind : uint8_t {
  None,
  Bool,
  Int,
  Float,
  Str,
  Bytes,
  Tuple,
  List,
  Dict,
  Set,
  Global,    // module in `str()`, name in `name()`
  Instance,  // NEWOBJ: `callable()` is the class, `args()` the argument tuple
  Reduce,    // REDUCE: `callable()` applied to `args()`
  PersId,    // BINPERSID: `args()` is the persistent id
};

/// A container's children: a view of an array in the tree's arena.
class Items {
 public:
  Items() = default;
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  ObjectPtr operator[](size_t k) const { return data_[k]; }
  const ObjectPtr* begin() const { return data_; }
  const ObjectPtr* end() const { return data_ + size_; }

 private:
  friend struct Object;
  Items(const ObjectPtr* data, uint32_t size) : data_(data), size_(size) {}
  const ObjectPtr* data_ = nullptr;
  uint32_t size_ = 0;
};

/// One pickled value. Dict entries are stored as items()[2k] (key), items()[2k+1] (value).
/// Instance/Reduce objects collect BUILD's `state()` and any SETITEMS/APPENDS in `items()`.
/// Strings are views into the tree's copy of the pickle bytes. Immutable values that repeat
/// (None, booleans, ints, tuples, torch.Size) may be one shared object.
///
/// A '.metadata' of millions of entries is tens of millions of objects, so the fields each
/// kind uses share storage (48 bytes an object). The accessors check the kind: asking an
/// object for what its kind lacks gives an empty value (0, "", no items, nullptr), never
/// another kind's bytes.
struct Object {
  Kind kind = Kind::None;
  bool b = false;  // Bool

  int64_t i() const { return kind == Kind::Int ? i_ : 0; }
  double f() const { return kind == Kind::Float ? f_ : 0.0; }
  /// Str and Bytes: the value; Global: the module.
  std::string_view str() const {
    return kind == Kind::Str || kind == Kind::Bytes || kind == Kind::Global
               ? std::string_view(text_, size_)
               : std::string_view();
  }
  /// Global: the name.
  std::string_view name() const {
    return kind == Kind::Global ? std::string_view(name_, name_size_) : std::string_view();
  }
  /// Tuple, List, Dict, Set, and what SETITEMS/APPENDS gave an Instance or Reduce. (An
  /// empty container never set items_.)
  Items items() const { return has_items() && size_ > 0 ? Items(items_, size_) : Items(); }
  /// Instance/Reduce: the class or function (always a Global).
  ObjectPtr callable() const { return is_call() ? callable_ : nullptr; }
  /// Instance/Reduce: the argument tuple; PersId: the persistent id.
  ObjectPtr args() const { return is_call() || kind == Kind::PersId ? args_ : nullptr; }
  /// Instance/Reduce: what BUILD set, if anything.
  ObjectPtr state() const { return is_call() ? state_ : nullptr; }

  bool is_global(std::string_view module, std::string_view global_name) const {
    return kind == Kind::Global && str() == module && name() == global_name;
  }
  /// For Reduce/Instance: whether the callable is the global module.name.
  bool calls(std::string_view module, std::string_view global_name) const {
    return is_call() && callable_ && callable_->is_global(module, global_name);
  }
  const char* kind_name() const;

 private:
  friend class Tree;
  friend class Machine;
  bool is_call() const { return kind == Kind::Instance || kind == Kind::Reduce; }
  bool has_items() const {
    return kind == Kind::Tuple || kind == Kind::List || kind == Kind::Dict ||
           kind == Kind::Set || is_call();
  }

  bool frozen_ = false;  // a torch.Size: one object may stand for many equal ones
  uint32_t size_ = 0;    // text_'s length or items_'s count
  union {
    int64_t i_ = 0;       // Int
    double f_;            // Float
    const char* text_;    // Str, Bytes, Global (module)
    ObjectPtr* items_;    // containers, Instance, Reduce
  };
  uint32_t capacity_ = 0;   // items_'s room
  uint32_t name_size_ = 0;  // Global
  union {
    const char* name_ = nullptr;  // Global
    ObjectPtr callable_;          // Instance, Reduce
  };
  ObjectPtr args_ = nullptr;   // Instance, Reduce, PersId
  ObjectPtr state_ = nullptr;  // Instance, Reduce
};

/// An unpickled object tree. It owns every object, in arenas (a '.metadata' of millions of
/// entries is tens of millions of objects, which must not each be a heap allocation), and,
/// unless made by unpickle_view, a copy of the pickle bytes.
class Tree {
 public:
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;
  Tree(Tree&&) = default;
  Tree& operator=(Tree&&) = default;
  ~Tree();

  ObjectPtr root() const { return root_; }
  ObjectPtr operator->() const { return root_; }

 private:
  friend class Machine;
  Tree() = default;
  Object* make(Kind kind);
  /// The shared object for None, True/False, ints 0-255 (K opcode) or the empty tuple.
  Object* shared(Kind kind, int64_t value = 0);
  /// Appends [first, first + n) to `target`'s items.
  void append(Object* target, Object* const* first, size_t n);

  // The pickle bytes, when the tree owns them (null after unpickle_view). On the heap: the
  // objects' strings stay valid when the tree moves (a std::string member would keep short
  // pickles inline, in the moved-from object).
  std::unique_ptr<const std::string> bytes_;
  Arena arena_;  // the objects and their item arrays
  ObjectPtr root_ = nullptr;
  std::unique_ptr<Object[]> shared_;  // None, False, True, (), ints 0-255
};

/// Parses one pickle; the tree keeps `bytes`. `source` names the input in error messages
/// ("'.metadata'").
Tree unpickle(std::string bytes, const std::string& source);
/// The same for a pickle in [data, data + size), which the tree copies.
Tree unpickle(const char* data, size_t size, const std::string& source);
/// The same without the copy: the tree's strings point into [data, data + size), which must
/// outlive the tree. For large pickles parsed and interpreted in one go ('.metadata').
Tree unpickle_view(const char* data, size_t size, const std::string& source);

/// Emits protocol-2 pickles, into one string or, streaming, to a sink.
class Writer {
 public:
  /// A memo slot: str() and global() return the slot their value lives in, and get() pushes
  /// it again (what a repeated str()/global() would do, without the lookup).
  using MemoIndex = uint32_t;
  /// Takes the next bytes of a streaming writer's output, in order. What it throws leaves the
  /// writer's call (the pickle is then unfinished).
  using Sink = std::function<void(std::string_view)>;

  /// Builds the pickle in memory; finish() returns it.
  Writer();
  /// Streams: hands the output to `sink` in pieces of `piece_bytes` or a little less (a
  /// value longer than that goes in a piece of its own size), the last one from finish().
  /// Protocol 2 has no frames or back-references into the output, so no piece is revisited,
  /// and the whole pickle never sits in memory ('.metadata' files of hundreds of MiB).
  Writer(Sink sink, size_t piece_bytes);

  /// Reserves room for about `bytes` of output (avoids regrowing a large pickle). A streaming
  /// writer ignores it.
  void reserve(size_t bytes) {
    if (!sink_) out_.reserve(bytes);
  }
  /// Whether the output goes to a sink in pieces (reserve() is then moot).
  bool streaming() const { return static_cast<bool>(sink_); }

  void none() { op(PickleOpCode::NONE); }
  void boolean(bool v) { op(v ? PickleOpCode::NEWTRUE : PickleOpCode::NEWFALSE); }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op(PickleOpCode::BININT1);
      byte(static_cast<uint8_t>(v));
    } else {
      wide_integer(v);
    }
  }
  void float64(double v);
  /// A str; repeated strings are written once and fetched from the memo.
  MemoIndex str(std::string_view v);
  /// Python bytes, the protocol-2 way: _codecs.encode(latin-1 text, 'latin1').
  void bytes(std::string_view v);
  /// A global reference (memoized).
  MemoIndex global(std::string_view module, std::string_view name);
  /// Pushes the value in memo slot `index` (from an earlier str() or global()).
  void get(MemoIndex index) { memo_op(PickleOpCode::BINGET, PickleOpCode::LONG_BINGET, index); }
  void mark() { op(PickleOpCode::MARK); }
  /// Builds a tuple of the last n pushed values (n <= 3 uses TUPLEn; otherwise requires mark()).
  void tuple(size_t n);
  /// Builds a tuple from everything since the last mark().
  void tuple_from_mark() { op(PickleOpCode::TUPLE); }
  /// begin_tuple(n); <push n values>; end_tuple(n): a tuple of any length.
  void begin_tuple(size_t n) {
    if (n > 3) mark();
  }
  void end_tuple(size_t n) {
    if (n > 3) tuple_from_mark();
    else tuple(n);
  }
  void empty_tuple() { op(PickleOpCode::EMPTY_TUPLE); }
  void empty_list() { op(PickleOpCode::EMPTY_LIST); }
  void appends() { op(PickleOpCode::APPENDS); }  // after mark() and the items
  void empty_dict() { op(PickleOpCode::EMPTY_DICT); }
  void setitems() { op(PickleOpCode::SETITEMS); }  // after mark() and key/value pairs
  void reduce() { op(PickleOpCode::REDUCE); }
  void newobj() { op(PickleOpCode::NEWOBJ); }
  void build() { op(PickleOpCode::BUILD); }
  void binpersid() { op(PickleOpCode::BINPERSID); }
  /// Appends STOP and returns the pickle; a streaming writer hands the rest to its sink and
  /// returns an empty string.
  std::string finish();

 private:
  // Memo tables keyed by views into `keys_`, whose strings never move: a lookup allocates
  // nothing. Strings and globals get separate tables ("a\nb" may be either).
  using MemoTable = std::unordered_map<std::string_view, MemoIndex>;
  MemoIndex memoize_top(MemoTable& table, std::string key);
  // The next n bytes of output, to be written now. out_ runs ahead of what is written (its
  // size is the room; written_ the bytes so far), so most calls are a compare and an add:
  // std::string's own push_back and append are calls into the library.
  char* room(size_t n) {
    if (out_.size() - written_ < n) extend(n);
    char* p = out_.data() + written_;
    written_ += n;
    return p;
  }
  void extend(size_t n);
  void op(PickleOpCode code) { byte(static_cast<uint8_t>(code)); }
  void byte(uint8_t b) { *room(1) = static_cast<char>(b); }
  void append(std::string_view bytes) {
    if (!bytes.empty()) std::memcpy(room(bytes.size()), bytes.data(), bytes.size());
  }
  void u32(uint32_t v) {
    char* p = room(4);
    for (int k = 0; k < 4; ++k) p[k] = static_cast<char>(v >> (8 * k));
  }
  void wide_integer(int64_t v);  // integer() past 0-255
  // A memo opcode with its index: the 1-byte form below 256, else the 4-byte one.
  void memo_op(PickleOpCode short_form, PickleOpCode long_form, MemoIndex index) {
    if (index < 256) {
      op(short_form);
      byte(static_cast<uint8_t>(index));
    } else {
      op(long_form);
      u32(index);
    }
  }

  // A streaming writer's: hands the bytes in out_ to the sink and starts out_ again.
  void flush();

  Sink sink_;  // empty: the pickle stays in out_
  std::string out_;
  size_t written_ = 0;
  std::deque<std::string> keys_;
  MemoTable strs_;
  MemoTable globals_;
  MemoIndex next_memo_ = 0;
};

}  // namespace dcp::detail::pickle
