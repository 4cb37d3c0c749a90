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
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dcp::detail::pickle {

struct Object;
using ObjectPtr = std::shared_ptr<Object>;

enum class Kind {
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
  Global,    // module in `str`, name in `name`
  Instance,  // NEWOBJ: `callable` is the class, `args` the argument tuple
  Reduce,    // REDUCE: `callable` applied to `args`
  PersId,    // BINPERSID: `args` is the persistent id
};

/// One pickled value. Dict entries are stored as items[2k] (key), items[2k+1] (value).
/// Instance/Reduce objects collect BUILD's `state` and any SETITEMS/APPENDS in `items`.
struct Object {
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string str;   // Str, Bytes, Global module
  std::string name;  // Global name
  std::vector<ObjectPtr> items;
  ObjectPtr callable;
  ObjectPtr args;
  ObjectPtr state;

  bool is_global(std::string_view module, std::string_view global_name) const {
    return kind == Kind::Global && str == module && name == global_name;
  }
  /// For Reduce/Instance: whether the callable is the global module.name.
  bool calls(std::string_view module, std::string_view global_name) const {
    return (kind == Kind::Reduce || kind == Kind::Instance) && callable &&
           callable->is_global(module, global_name);
  }
  const char* kind_name() const;
};

/// Parses one pickle. `source` names the input in error messages ("'.metadata'").
/// REQUIRES: the whole pickle (up to STOP) lies in [data, data + size).
ObjectPtr unpickle(const char* data, size_t size, const std::string& source);

/// Emits protocol-2 pickles.
class Writer {
 public:
  Writer();

  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void float64(double v);
  /// A str; repeated strings are written once and fetched from the memo.
  void str(std::string_view v);
  /// Python bytes, the protocol-2 way: _codecs.encode(latin-1 text, 'latin1').
  void bytes(std::string_view v);
  /// A global reference (memoized).
  void global(std::string_view module, std::string_view name);
  void mark();
  /// Builds a tuple of the last n pushed values (n <= 3 uses TUPLEn; otherwise requires mark()).
  void tuple(size_t n);
  /// Builds a tuple from everything since the last mark().
  void tuple_from_mark();
  /// begin_tuple(n); <push n values>; end_tuple(n): a tuple of any length.
  void begin_tuple(size_t n) {
    if (n > 3) mark();
  }
  void end_tuple(size_t n) {
    if (n > 3) tuple_from_mark();
    else tuple(n);
  }
  void empty_tuple();
  void empty_list();
  void appends();  // after mark() and the items
  void empty_dict();
  void setitems();  // after mark() and key/value pairs
  void reduce();
  void newobj();
  void build();
  void binpersid();
  /// Appends STOP and returns the pickle.
  std::string finish();

 private:
  void memoize_top(const std::string& key);
  bool fetch_memo(const std::string& key);
  void op(uint8_t code);
  void u32(uint32_t v);

  std::string out_;
  std::unordered_map<std::string, uint32_t> memo_;
};

}  // namespace dcp::detail::pickle
