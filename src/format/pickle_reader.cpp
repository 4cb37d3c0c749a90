// The restricted pickle reader (see pickle.h).
//
// It is the pickle virtual machine with every callable-producing opcode made inert:
//   GLOBAL / STACK_GLOBAL  push a Global(module, name) reference; nothing is imported;
//   REDUCE / NEWOBJ        push a Reduce/Instance record holding the callable and arguments;
//   BUILD                  stores the state on that record;
//   SETITEMS / APPENDS     on a record (OrderedDict() and friends) collect items on it.
// Opcodes outside the supported set (INST, OBJ, EXT*, PERSID, out-of-band buffers, ...) raise.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <unordered_map>

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

Tree::~Tree() = default;

Object* Tree::make(Kind kind) {
  static_assert(std::is_trivially_destructible_v<Object>, "the arena runs no destructors");
  auto* o = new (arena_.allocate(sizeof(Object), alignof(Object))) Object();
  o->kind = kind;
  return o;
}

Object* Tree::shared(Kind kind, int64_t value) {
  if (!shared_) {
    shared_.reset(new Object[4 + 256]);
    shared_[0].kind = Kind::None;
    shared_[1].kind = Kind::Bool;
    shared_[2].kind = Kind::Bool;
    shared_[2].b = true;
    shared_[3].kind = Kind::Tuple;
    for (int k = 0; k < 256; ++k) {
      shared_[4 + k].kind = Kind::Int;
      shared_[4 + k].i_ = k;
    }
  }
  switch (kind) {
    case Kind::None: return &shared_[0];
    case Kind::Bool: return &shared_[value ? 2 : 1];
    case Kind::Tuple: return &shared_[3];
    default: return &shared_[4 + value];
  }
}

void Tree::append(Object* target, Object* const* first, size_t n) {
  const size_t needed = size_t{target->size_} + n;
  if (needed > target->capacity_) {
    // Grow by doubling inside the arena; the old array stays behind (at most as much again).
    const size_t capacity = std::max<size_t>(needed, 2 * size_t{target->capacity_});
    TORCH_CHECK(capacity <= UINT32_MAX, "pickle container too large");
    ObjectPtr* data = arena_.allocate_array<ObjectPtr>(capacity);
    if (target->size_) std::copy(target->items_, target->items_ + target->size_, data);
    target->items_ = data;
    target->capacity_ = static_cast<uint32_t>(capacity);
  }
  std::copy(first, first + n, target->items_ + target->size_);
  target->size_ = static_cast<uint32_t>(needed);
}

class Machine {
 public:
  // Runs over [data, data + size), which the caller keeps alive as long as the tree (or hands
  // to the tree in `owned`).
  Machine(const char* data, size_t size, const std::string& source,
          std::unique_ptr<const std::string> owned = nullptr)
      : data_(reinterpret_cast<const uint8_t*>(data)), size_(size), source_(source) {
    TORCH_CHECK(size > 0, "corrupt pickle in ", source, ": empty");
    tree_.bytes_ = std::move(owned);
    for (auto& cache : tuple_caches_) cache.resize(size_t{1} << cache_bits_);
  }

  Tree run() && {
    while (true) {
      op_pos_ = pos_;
      const auto code = static_cast<PickleOpCode>(u8());
      if (code == PickleOpCode::STOP) {
        check(stack_.size() == 1, "STOP with ", stack_.size(), " values on the stack");
        tree_.root_ = stack_.back();
        return std::move(tree_);
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
    if (n > size_ - pos_) {
      fail("truncated: needs ", n, " more bytes, ", size_ - pos_, " left");
    }
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
  std::string_view text(uint64_t n) {
    const uint8_t* p = take(n);
    return std::string_view(reinterpret_cast<const char*>(p), n);
  }
  std::string_view line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    check(nl != nullptr, "unterminated GLOBAL name");
    size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
    std::string_view s = text(n);
    pos_ += 1;
    return s;
  }

  Object* make(Kind kind) { return tree_.make(kind); }
  void push(Object* o) { stack_.push_back(o); }
  // The value just below stack position `end`; it must lie above the topmost MARK.
  Object* below(size_t end) {
    if (end == 0 || (!marks_.empty() && end <= marks_.back())) fail("stack underflow");
    return stack_[end - 1];
  }
  Object* top() { return below(stack_.size()); }
  Object* pop() {
    Object* o = top();
    stack_.pop_back();
    return o;
  }
  // Pops the topmost MARK; the values above it stay on the stack at [mark, size()).
  size_t pop_mark() {
    check(!marks_.empty(), "no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  // Moves the values at [from, size()) into `target`'s items.
  void move_items(Object* target, size_t from) {
    tree_.append(target, stack_.data() + from, stack_.size() - from);
    stack_.resize(from);
  }
  // Python's memo keys are dense from 0, so they live in a vector; a sparse (hostile) index
  // goes to a map. The dense range may later grow over a key the map holds: each key lives in
  // one place only, and lookups fall back to the map.
  void put_memo(uint64_t index) {
    check(!stack_.empty(), "memo store from an empty stack");
    check(index < (uint64_t{1} << 32), "memo index too large");
    const auto key = static_cast<uint32_t>(index);
    // The dense vector grows only while it stays within a constant factor of the keys stored:
    // LONG_BINPUT with ever larger indices would otherwise cost 8 KiB per 5 input bytes.
    if (index < memo_.size() ||
        (index < memo_.size() + 1024 && index < 4 * (memo_count_ + 1) + 1024)) {
      if (index >= memo_.size()) memo_.resize(index + 1, nullptr);
      const bool was_sparse = !sparse_memo_.empty() && sparse_memo_.erase(key) > 0;
      if (memo_[index] == nullptr && !was_sparse) ++memo_count_;
      memo_[index] = stack_.back();
    } else if (sparse_memo_.insert_or_assign(key, stack_.back()).second) {
      ++memo_count_;
    }
  }
  void get_memo(uint64_t index) {
    Object* o = index < memo_.size() ? memo_[index] : nullptr;
    if (o == nullptr && !sparse_memo_.empty()) {
      auto it = sparse_memo_.find(static_cast<uint32_t>(index));
      if (it != sparse_memo_.end()) o = it->second;
    }
    check(o != nullptr, "memo key ", index, " not found");
    push(o);
  }
  // Ints and tuples never change once made, and a '.metadata' repeats the same offsets,
  // lengths and shapes millions of times. So an int or small tuple equal to one made recently
  // is that object again (as ints 0-255 always are): a one-way cache per kind, and per length
  // for tuples. A slot keeps the value's key (the int, a hash of the tuple's items' addresses)
  // next to the object, so a miss costs no visit to the object. The caches grow with the
  // input, one slot per 64 bytes, from 16 slots (a record's data.pkl of a few hundred bytes,
  // parsed once per record: 20,000 times per rank in a load of small tensors) to 64 Ki (a
  // '.metadata' cycles through a tuple per rank and shard).
  // Tuple keys hash addresses, so which of two tuples of one length evict each other changes
  // from run to run; tuples of different lengths, like torch.Size's sizes and the 1-tuple of
  // its arguments, never do.
  struct CacheSlot {
    uint64_t key = 0;
    Object* object = nullptr;
  };
  static constexpr size_t kCachedTupleSize = 4;
  static int cache_bits(size_t input_bytes) {
    int bits = 4;
    while (bits < 16 && (input_bytes >> (bits + 6)) != 0) ++bits;
    return bits;
  }
  CacheSlot& cache_slot(std::vector<CacheSlot>& cache, uint64_t key) const {
    return cache[(key * 0x9E3779B97F4A7C15ull) >> (64 - cache_bits_)];
  }

  Object* make_int(int64_t v) {
    const auto key = static_cast<uint64_t>(v);
    CacheSlot& slot = cache_slot(int_cache_, key);
    if (slot.object != nullptr && slot.key == key) return slot.object;
    auto* o = make(Kind::Int);
    o->i_ = v;
    slot = {key, o};
    return o;
  }
  // A tuple of the n values at `items`.
  Object* make_tuple(Object* const* items, size_t n) {
    CacheSlot* slot = nullptr;
    uint64_t key = n;
    if (n > 0 && n <= kCachedTupleSize) {
      for (size_t k = 0; k < n; ++k) key = key * 31 + reinterpret_cast<uintptr_t>(items[k]);
      slot = &cache_slot(tuple_caches_[n - 1], key);
      const Object* c = slot->object;
      if (c != nullptr && slot->key == key && c->size_ == n &&
          std::equal(items, items + n, c->items_)) {
        return slot->object;
      }
    }
    auto* o = make(Kind::Tuple);
    tree_.append(o, items, n);
    if (slot != nullptr) *slot = {key, o};
    return o;
  }
  // torch.Size(args): frozen, so it is shared like a tuple (equal args are one tuple).
  Object* make_size(Object* callable, Object* args) {
    const auto key = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(args));
    CacheSlot& slot = cache_slot(size_cache_, key);
    if (slot.object != nullptr && slot.key == key) return slot.object;
    auto* o = make(Kind::Reduce);
    o->callable_ = callable;
    o->args_ = args;
    o->frozen_ = true;
    slot = {key, o};
    return o;
  }
  Object* make_str(std::string_view s, Kind kind = Kind::Str) {
    check(s.size() <= UINT32_MAX, "string of ", s.size(), " bytes (at most 4 GiB supported)");
    auto* o = make(kind);
    o->text_ = s.data();
    o->size_ = static_cast<uint32_t>(s.size());
    return o;
  }
  Object* make_global(std::string_view module, std::string_view name) {
    check(module.size() <= UINT32_MAX && name.size() <= UINT32_MAX, "global name too long");
    auto* o = make(Kind::Global);
    o->text_ = module.data();
    o->size_ = static_cast<uint32_t>(module.size());
    o->name_ = name.data();
    o->name_size_ = static_cast<uint32_t>(name.size());
    return o;
  }
  int64_t long_bytes(uint64_t n) {
    if (n > 8) {  // a valid pickle of an int that C++ cannot hold: not corrupt, unsupported
      const uint8_t* p = take(n);
      TORCH_CHECK_NOT_IMPLEMENTED(false, "a Python int that does not fit in 64 bits (",
                                  decimal_of(p, n), ", ", n, " bytes) in ", source_,
                                  ": dcp holds ints as int64");
    }
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (uint64_t k = n; k-- > 0;) v = (v << 8) | p[k];
    if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  // The decimal form of a little-endian two's-complement integer of n bytes (for messages;
  // long ones are abbreviated by their digit count).
  static std::string decimal_of(const uint8_t* p, uint64_t n) {
    constexpr uint64_t kMaxBytes = 64;
    if (n > kMaxBytes) return "an int of " + std::to_string(n) + " bytes";
    std::vector<uint8_t> mag(p, p + n);  // little-endian magnitude after the sign is taken
    const bool negative = (mag.back() & 0x80) != 0;
    if (negative) {  // two's complement: invert and add one
      unsigned carry = 1;
      for (auto& b : mag) {
        const unsigned v = static_cast<uint8_t>(~b) + carry;
        b = static_cast<uint8_t>(v);
        carry = v >> 8;
      }
    }
    std::string digits;
    while (std::any_of(mag.begin(), mag.end(), [](uint8_t b) { return b != 0; })) {
      unsigned rem = 0;
      for (size_t i = mag.size(); i-- > 0;) {
        const unsigned cur = (rem << 8) | mag[i];
        mag[i] = static_cast<uint8_t>(cur / 10);
        rem = cur % 10;
      }
      digits.push_back(static_cast<char>('0' + rem));
    }
    if (digits.empty()) digits = "0";
    if (negative) digits.push_back('-');
    return std::string(digits.rbegin(), digits.rend());
  }
  // torch.Size is a tuple: Python fails to change one (it has no items to set, no append,
  // no __dict__ for BUILD). Here that also keeps shared ones shared.
  void check_not_frozen(const Object* target, const char* op) const {
    check(!target->frozen_, op, " on a torch.Size");
  }
  void check_setitems_target(const Object* target, size_t n) const {
    check_not_frozen(target, "SETITEMS");
    check(n % 2 == 0, "SETITEMS with an odd number of values");
    check(target->kind == Kind::Dict || target->kind == Kind::Reduce ||
              target->kind == Kind::Instance,
          "SETITEM on a ", target->kind_name());
  }
  void check_appends_target(const Object* target) const {
    check_not_frozen(target, "APPENDS");
    check(target->kind == Kind::List || target->kind == Kind::Reduce ||
              target->kind == Kind::Instance,
          "APPEND on a ", target->kind_name());
  }

  void step(PickleOpCode code) {
    switch (code) {
      case PickleOpCode::PROTO:
        check(u8() <= 5, "unsupported pickle protocol");
        break;
      case PickleOpCode::FRAME:  // a buffering hint
        take(8);
        break;
      case PickleOpCode::NONE: push(tree_.shared(Kind::None)); break;
      case PickleOpCode::NEWTRUE:
      case PickleOpCode::NEWFALSE: push(tree_.shared(Kind::Bool, code == PickleOpCode::NEWTRUE)); break;
      case PickleOpCode::BININT: push(make_int(static_cast<int32_t>(le(4)))); break;
      case PickleOpCode::BININT1: push(tree_.shared(Kind::Int, static_cast<int64_t>(le(1)))); break;
      case PickleOpCode::BININT2: push(make_int(static_cast<int64_t>(le(2)))); break;
      case PickleOpCode::LONG1: push(make_int(long_bytes(le(1)))); break;
      case PickleOpCode::LONG4: push(make_int(long_bytes(le(4)))); break;
      case PickleOpCode::BINFLOAT: {
        const uint8_t* p = take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];
        auto* o = make(Kind::Float);
        std::memcpy(&o->f_, &bits, sizeof bits);
        push(o);
        break;
      }
      case PickleOpCode::SHORT_BINUNICODE: push(make_str(text(le(1)))); break;
      case PickleOpCode::BINUNICODE: push(make_str(text(le(4)))); break;
      case PickleOpCode::BINUNICODE8: push(make_str(text(le(8)))); break;
      case PickleOpCode::SHORT_BINSTRING: push(make_str(text(le(1)))); break;  // Python 2 str
      case PickleOpCode::BINSTRING: push(make_str(text(le(4)))); break;
      case PickleOpCode::SHORT_BINBYTES: push(make_str(text(le(1)), Kind::Bytes)); break;
      case PickleOpCode::BINBYTES: push(make_str(text(le(4)), Kind::Bytes)); break;
      case PickleOpCode::BINBYTES8: push(make_str(text(le(8)), Kind::Bytes)); break;
      case PickleOpCode::MARK: marks_.push_back(stack_.size()); break;
      case PickleOpCode::EMPTY_DICT: push(make(Kind::Dict)); break;
      case PickleOpCode::EMPTY_LIST: push(make(Kind::List)); break;
      case PickleOpCode::EMPTY_TUPLE: push(tree_.shared(Kind::Tuple)); break;
      case PickleOpCode::EMPTY_SET: push(make(Kind::Set)); break;
      case PickleOpCode::SETITEM: {
        Object* kv[2];
        kv[1] = pop();
        kv[0] = pop();
        Object* target = top();
        check_setitems_target(target, 2);
        tree_.append(target, kv, 2);
        break;
      }
      case PickleOpCode::SETITEMS: {
        const size_t m = pop_mark();
        Object* target = below(m);
        check_setitems_target(target, stack_.size() - m);
        move_items(target, m);
        break;
      }
      case PickleOpCode::APPEND: {
        Object* v = pop();
        Object* target = top();
        check_appends_target(target);
        tree_.append(target, &v, 1);
        break;
      }
      case PickleOpCode::APPENDS: {
        const size_t m = pop_mark();
        Object* target = below(m);
        check_appends_target(target);
        move_items(target, m);
        break;
      }
      case PickleOpCode::ADDITEMS: {
        const size_t m = pop_mark();
        Object* target = below(m);
        check(target->kind == Kind::Set, "ADDITEMS on a ", target->kind_name());
        move_items(target, m);
        break;
      }
      case PickleOpCode::FROZENSET: {
        const size_t m = pop_mark();
        auto* o = make(Kind::Set);
        move_items(o, m);
        push(o);
        break;
      }
      case PickleOpCode::TUPLE1:
      case PickleOpCode::TUPLE2:
      case PickleOpCode::TUPLE3: {
        const size_t n = static_cast<size_t>(code) - static_cast<size_t>(PickleOpCode::TUPLE1) + 1;
        Object* values[3];
        for (size_t k = n; k-- > 0;) values[k] = pop();
        push(make_tuple(values, n));
        break;
      }
      case PickleOpCode::TUPLE: {
        const size_t m = pop_mark();
        auto* o = make_tuple(stack_.data() + m, stack_.size() - m);
        stack_.resize(m);
        push(o);
        break;
      }
      case PickleOpCode::POP: pop(); break;
      case PickleOpCode::POP_MARK: stack_.resize(pop_mark()); break;
      case PickleOpCode::DUP: push(top()); break;
      case PickleOpCode::MEMOIZE: put_memo(memo_count_); break;  // key len(memo), as Python
      case PickleOpCode::BINPUT: put_memo(le(1)); break;
      case PickleOpCode::LONG_BINPUT: put_memo(le(4)); break;
      case PickleOpCode::BINGET: get_memo(le(1)); break;
      case PickleOpCode::LONG_BINGET: get_memo(le(4)); break;
      case PickleOpCode::GLOBAL: {
        std::string_view module = line();
        std::string_view name = line();
        push(make_global(module, name));
        break;
      }
      case PickleOpCode::STACK_GLOBAL: {
        Object* name = pop();
        Object* module = pop();
        check(module->kind == Kind::Str && name->kind == Kind::Str,
              "STACK_GLOBAL needs two strings");
        push(make_global(module->str(), name->str()));
        break;
      }
      case PickleOpCode::REDUCE:
      case PickleOpCode::NEWOBJ: {
        Object* args = pop();
        Object* callable = pop();
        check(args->kind == Kind::Tuple, code == PickleOpCode::REDUCE ? "REDUCE" : "NEWOBJ",
              " arguments are not a tuple");
        check(callable->kind == Kind::Global, code == PickleOpCode::REDUCE ? "REDUCE" : "NEWOBJ",
              " of a ", callable->kind_name(), " (only named globals are allowed)");
        if (code == PickleOpCode::REDUCE && callable->is_global("torch", "Size")) {
          push(make_size(callable, args));
          break;
        }
        auto* o = make(code == PickleOpCode::REDUCE ? Kind::Reduce : Kind::Instance);
        o->callable_ = callable;
        o->args_ = args;
        push(o);
        break;
      }
      case PickleOpCode::NEWOBJ_EX: {
        Object* kwargs = pop();
        Object* args = pop();
        Object* callable = pop();
        check(args->kind == Kind::Tuple && kwargs->kind == Kind::Dict && kwargs->items().empty() &&
                  callable->kind == Kind::Global,
              "unsupported NEWOBJ_EX");
        auto* o = make(Kind::Instance);
        o->callable_ = callable;
        o->args_ = args;
        push(o);
        break;
      }
      case PickleOpCode::BUILD: {
        Object* state = pop();
        Object* target = top();
        check(target->kind == Kind::Instance || target->kind == Kind::Reduce,
              "BUILD on a ", target->kind_name());
        check_not_frozen(target, "BUILD");
        target->state_ = state;
        break;
      }
      case PickleOpCode::BINPERSID: {
        auto* o = make(Kind::PersId);
        o->args_ = pop();
        push(o);
        break;
      }
      default:
        fail("unsupported or unknown opcode 0x", std::hex, static_cast<int>(code));
    }
  }

  Tree tree_;
  const uint8_t* data_;
  size_t size_;
  const std::string& source_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  std::vector<Object*> stack_;
  std::vector<size_t> marks_;
  std::vector<Object*> memo_;
  std::unordered_map<uint32_t, Object*> sparse_memo_;
  int cache_bits_ = cache_bits(size_);
  std::vector<CacheSlot> int_cache_ = std::vector<CacheSlot>(size_t{1} << cache_bits_);
  std::vector<CacheSlot> tuple_caches_[kCachedTupleSize];  // by length - 1; sized in the ctor
  std::vector<CacheSlot> size_cache_ = std::vector<CacheSlot>(size_t{1} << cache_bits_);
  size_t memo_count_ = 0;  // distinct keys in memo_ and sparse_memo_
};

Tree unpickle(std::string bytes, const std::string& source) {
  auto owned = std::make_unique<const std::string>(std::move(bytes));
  const char* data = owned->data();
  const size_t size = owned->size();
  return Machine(data, size, source, std::move(owned)).run();
}

Tree unpickle(const char* data, size_t size, const std::string& source) {
  return unpickle(std::string(data, size), source);
}

Tree unpickle_view(const char* data, size_t size, const std::string& source) {
  return Machine(data, size, source).run();
}

}  // namespace dcp::detail::pickle
