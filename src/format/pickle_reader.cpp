// The restricted pickle reader (see pickle.h).
//
// It is the pickle virtual machine with every callable-producing opcode made inert:
//   GLOBAL / STACK_GLOBAL  push a Global(module, name) reference; nothing is imported;
//   REDUCE / NEWOBJ        push a Reduce/Instance record holding the callable and arguments;
//   BUILD                  stores the state on that record;
//   SETITEMS / APPENDS     on a record (OrderedDict() and friends) collect items on it.
// Opcodes outside the supported set (INST, OBJ, EXT*, PERSID, out-of-band buffers, ...) raise.
#include <c10/util/Exception.h>

#include <cstring>

#include "format/pickle.h"

namespace dcp::detail::pickle {

const char* Object::kind_name() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Set: return "set";
    case Kind::Global: return "global";
    case Kind::Instance: return "object";
    case Kind::Reduce: return "reduce";
    case Kind::PersId: return "persistent id";
  }
  return "?";
}

namespace {

class Machine {
 public:
  Machine(const char* data, size_t size, const std::string& source)
      : data_(reinterpret_cast<const uint8_t*>(data)), size_(size), source_(source) {}

  ObjectPtr run() {
    while (true) {
      op_pos_ = pos_;
      const uint8_t code = u8();
      if (code == '.') {  // STOP
        check(stack_.size() == 1, "STOP with ", stack_.size(), " values on the stack");
        return stack_.back();
      }
      step(code);
    }
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    TORCH_CHECK(false, "corrupt pickle in ", source_, " at byte ", op_pos_, ": ",
                c10::str(args...));
  }
  template <typename... Args>
  void check(bool cond, const Args&... args) const {
    if (!cond) fail(args...);
  }

  const uint8_t* take(uint64_t n) {
    check(n <= size_ - pos_, "truncated: needs ", n, " more bytes, ", size_ - pos_, " left");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  uint8_t u8() { return *take(1); }
  uint64_t le(int n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
    return v;
  }
  std::string text(uint64_t n) {
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  std::string line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    check(nl != nullptr, "unterminated GLOBAL name");
    size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
    std::string s = text(n);
    pos_ += 1;
    return s;
  }

  static ObjectPtr make(Kind kind) {
    auto o = std::make_shared<Object>();
    o->kind = kind;
    return o;
  }
  void push(ObjectPtr o) { stack_.push_back(std::move(o)); }
  ObjectPtr pop() {
    check(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()),
          "stack underflow");
    ObjectPtr o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  ObjectPtr& top() {
    check(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()),
          "stack underflow");
    return stack_.back();
  }
  std::vector<ObjectPtr> pop_mark() {
    check(!marks_.empty(), "no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<ObjectPtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void put_memo(uint64_t index) {
    check(!stack_.empty(), "memo store from an empty stack");
    check(index < (uint64_t{1} << 32), "memo index too large");
    memo_[static_cast<uint32_t>(index)] = stack_.back();
  }
  void get_memo(uint64_t index) {
    auto it = memo_.find(static_cast<uint32_t>(index));
    check(index < (uint64_t{1} << 32) && it != memo_.end(), "memo key ", index, " not found");
    push(it->second);
  }
  ObjectPtr make_int(int64_t v) {
    auto o = make(Kind::Int);
    o->i = v;
    return o;
  }
  ObjectPtr make_str(std::string s, Kind kind = Kind::Str) {
    auto o = make(kind);
    o->str = std::move(s);
    return o;
  }
  ObjectPtr make_tuple(std::vector<ObjectPtr> items) {
    auto o = make(Kind::Tuple);
    o->items = std::move(items);
    return o;
  }
  ObjectPtr make_global(std::string module, std::string name) {
    auto o = make(Kind::Global);
    o->str = std::move(module);
    o->name = std::move(name);
    return o;
  }
  int64_t long_bytes(uint64_t n) {
    check(n <= 8, "integer of ", n, " bytes does not fit in 64 bits");
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (uint64_t k = n; k-- > 0;) v = (v << 8) | p[k];
    if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  void add_setitems(ObjectPtr& target, std::vector<ObjectPtr> kv) {
    check(kv.size() % 2 == 0, "SETITEMS with an odd number of values");
    check(target->kind == Kind::Dict || target->kind == Kind::Reduce ||
              target->kind == Kind::Instance,
          "SETITEM on a ", target->kind_name());
    for (auto& o : kv) target->items.push_back(std::move(o));
  }
  void add_appends(ObjectPtr& target, std::vector<ObjectPtr> values) {
    check(target->kind == Kind::List || target->kind == Kind::Reduce ||
              target->kind == Kind::Instance,
          "APPEND on a ", target->kind_name());
    for (auto& o : values) target->items.push_back(std::move(o));
  }

  void step(uint8_t code) {
    switch (code) {
      case 0x80:  // PROTO
        check(u8() <= 5, "unsupported pickle protocol");
        break;
      case 0x95:  // FRAME: a buffering hint
        take(8);
        break;
      case 'N': push(make(Kind::None)); break;
      case 0x88:
      case 0x89: {
        auto o = make(Kind::Bool);
        o->b = code == 0x88;
        push(o);
        break;
      }
      case 'J': push(make_int(static_cast<int32_t>(le(4)))); break;
      case 'K': push(make_int(static_cast<int64_t>(le(1)))); break;
      case 'M': push(make_int(static_cast<int64_t>(le(2)))); break;
      case 0x8a: push(make_int(long_bytes(le(1)))); break;
      case 0x8b: push(make_int(long_bytes(le(4)))); break;
      case 'G': {
        const uint8_t* p = take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];
        auto o = make(Kind::Float);
        std::memcpy(&o->f, &bits, sizeof bits);
        push(o);
        break;
      }
      case 0x8c: push(make_str(text(le(1)))); break;
      case 'X': push(make_str(text(le(4)))); break;
      case 0x8d: push(make_str(text(le(8)))); break;
      case 'U': push(make_str(text(le(1)))); break;  // SHORT_BINSTRING (Python 2 str)
      case 'T': push(make_str(text(le(4)))); break;  // BINSTRING
      case 'C': push(make_str(text(le(1)), Kind::Bytes)); break;
      case 'B': push(make_str(text(le(4)), Kind::Bytes)); break;
      case 0x8e: push(make_str(text(le(8)), Kind::Bytes)); break;
      case '(': marks_.push_back(stack_.size()); break;
      case '}': push(make(Kind::Dict)); break;
      case ']': push(make(Kind::List)); break;
      case ')': push(make(Kind::Tuple)); break;
      case 0x8f: push(make(Kind::Set)); break;
      case 's': {
        ObjectPtr v = pop();
        ObjectPtr k = pop();
        add_setitems(top(), {std::move(k), std::move(v)});
        break;
      }
      case 'u': {
        auto kv = pop_mark();
        add_setitems(top(), std::move(kv));
        break;
      }
      case 'a': {
        ObjectPtr v = pop();
        add_appends(top(), {std::move(v)});
        break;
      }
      case 'e': {
        auto values = pop_mark();
        add_appends(top(), std::move(values));
        break;
      }
      case 0x90: {  // ADDITEMS
        auto values = pop_mark();
        check(top()->kind == Kind::Set, "ADDITEMS on a ", top()->kind_name());
        for (auto& o : values) top()->items.push_back(std::move(o));
        break;
      }
      case 0x91: {  // FROZENSET
        auto o = make(Kind::Set);
        o->items = pop_mark();
        push(o);
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        const size_t n = code - 0x84;
        std::vector<ObjectPtr> items(n);
        for (size_t k = n; k-- > 0;) items[k] = pop();
        push(make_tuple(std::move(items)));
        break;
      }
      case 't': push(make_tuple(pop_mark())); break;
      case '0': pop(); break;
      case '1': pop_mark(); break;
      case '2': push(top()); break;
      case 0x94: put_memo(memo_.size()); break;  // MEMOIZE
      case 'q': put_memo(le(1)); break;
      case 'r': put_memo(le(4)); break;
      case 'h': get_memo(le(1)); break;
      case 'j': get_memo(le(4)); break;
      case 'c': {
        std::string module = line();
        std::string name = line();
        push(make_global(std::move(module), std::move(name)));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        ObjectPtr name = pop();
        ObjectPtr module = pop();
        check(module->kind == Kind::Str && name->kind == Kind::Str,
              "STACK_GLOBAL needs two strings");
        push(make_global(module->str, name->str));
        break;
      }
      case 'R':
      case 0x81: {  // REDUCE, NEWOBJ
        ObjectPtr args = pop();
        ObjectPtr callable = pop();
        check(args->kind == Kind::Tuple, code == 'R' ? "REDUCE" : "NEWOBJ",
              " arguments are not a tuple");
        check(callable->kind == Kind::Global, code == 'R' ? "REDUCE" : "NEWOBJ",
              " of a ", callable->kind_name(), " (only named globals are allowed)");
        auto o = make(code == 'R' ? Kind::Reduce : Kind::Instance);
        o->callable = std::move(callable);
        o->args = std::move(args);
        push(o);
        break;
      }
      case 0x92: {  // NEWOBJ_EX
        ObjectPtr kwargs = pop();
        ObjectPtr args = pop();
        ObjectPtr callable = pop();
        check(args->kind == Kind::Tuple && kwargs->kind == Kind::Dict && kwargs->items.empty() &&
                  callable->kind == Kind::Global,
              "unsupported NEWOBJ_EX");
        auto o = make(Kind::Instance);
        o->callable = std::move(callable);
        o->args = std::move(args);
        push(o);
        break;
      }
      case 'b': {  // BUILD
        ObjectPtr state = pop();
        ObjectPtr& target = top();
        check(target->kind == Kind::Instance || target->kind == Kind::Reduce,
              "BUILD on a ", target->kind_name());
        target->state = std::move(state);
        break;
      }
      case 'Q': {  // BINPERSID
        auto o = make(Kind::PersId);
        o->args = pop();
        push(o);
        break;
      }
      default:
        fail("unsupported or unknown opcode 0x", std::hex, static_cast<int>(code));
    }
  }

  const uint8_t* data_;
  size_t size_;
  const std::string& source_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  std::vector<ObjectPtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, ObjectPtr> memo_;
};

}  // namespace

ObjectPtr unpickle(const char* data, size_t size, const std::string& source) {
  TORCH_CHECK(size > 0, "corrupt pickle in ", source, ": empty");
  return Machine(data, size, source).run();
}

}  // namespace dcp::detail::pickle
