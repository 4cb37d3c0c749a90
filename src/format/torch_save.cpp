// torch.save records (see torch_save.h).
//
// Writing: ZipWriter (PyTorchStreamWriter's bytes; PyTorchStreamWriter itself at 4 GiB and
// beyond), records in torch.save's order:
//   data.pkl, .format_version ("1"), .storage_alignment ("64"), byteorder ("little"),
//   data/<key> for each storage; writeEndOfFile adds version and .data/serialization_id.
// data.pkl for a tensor (docs/format.md §3):
//   _rebuild_tensor_v2(PERSID('storage', torch.<Name>Storage, key, 'cpu', numel),
//                      storage_offset, size, stride, requires_grad=False, OrderedDict())
// and _rebuild_tensor_v3(..., dtype) with torch.UntypedStorage (numel in bytes) for dtypes
// that have no legacy storage class.
//
// Reading: the checked zip directory and the records' local headers (Note [Reading records
// without LibTorch]); data.pkl through the restricted pickle reader.
#include "format/torch_save.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/versions.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <optional>

#include "format/dtypes.h"
#include "format/pickle.h"
#include "format/zip_directory.h"
#include "format/zip_writer.h"
#include "util/crc32.h"
#include "util/checked.h"
#include "util/error_context.h"

namespace dcp::detail {
namespace {

constexpr int kMaxValueDepth = 256;

// ---------------------------------------------------------------------------------------------
// Writing

// Note [Sink failures]: PyTorchStreamWriter calls its writer function from inside miniz, and
// its destructor writes the zip trailer when the archive was not finished. An exception from
// the sink must therefore never unwind through it: it would leave miniz mid-record, and the
// destructor's trailer write would throw again during unwinding (std::terminate: a full disk
// killed the process). So the writer function catches the sink's first failure, drops every
// later byte, and finish() rethrows that failure once PyTorchStreamWriter is done; an archive
// abandoned by another error drops its trailer.
//
// Archives below 4 GiB are written by ZipWriter (the same bytes; Note [The zip writer]), which
// lets the sink's exceptions propagate; only larger ones go through PyTorchStreamWriter.
class ArchiveWriter {
 public:
  explicit ArchiveWriter(const ByteSink& sink) : sink_(sink) {}
  ~ArchiveWriter() { abandoned_ = true; }  // writer_'s destructor writes nothing
  ArchiveWriter(const ArchiveWriter&) = delete;
  ArchiveWriter& operator=(const ArchiveWriter&) = delete;

  // Pickles a tensor reference into `w` and remembers its storage for data/<key>.
  void tensor(pickle::Writer& w, const at::Tensor& original) {
    TORCH_CHECK(original.device().is_cpu(), "writing a ", original.device(),
                " tensor: move it to the CPU first");
    TORCH_CHECK(original.layout() == c10::Layout::Strided, "only strided tensors can be saved");
    at::Tensor t = original;
    const uint64_t nbytes = t.numel() * t.element_size();
    const bool compact = t.is_contiguous() && t.storage_offset() == 0 &&
                         t.storage().nbytes() == nbytes;
    if (!compact) t = t.clone(at::MemoryFormat::Contiguous);
    const std::string key = std::to_string(storages_.size());
    storages_.push_back(t);

    const c10::ScalarType dtype = t.scalar_type();
    const auto legacy = legacy_storage_name(dtype);
    w.global("torch._utils", legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    w.mark();
    w.mark();
    w.str("storage");
    w.global("torch", legacy ? *legacy : "UntypedStorage");
    w.str(key);
    w.str("cpu");
    w.integer(legacy ? t.numel() : static_cast<int64_t>(nbytes));
    w.tuple_from_mark();
    w.binpersid();
    w.integer(0);
    int_tuple(w, t.sizes());
    int_tuple(w, t.strides());
    w.boolean(false);
    w.global("collections", "OrderedDict");
    w.empty_tuple();
    w.reduce();
    if (!legacy) w.global("torch", python_dtype_name(dtype));
    w.tuple_from_mark();
    w.reduce();
  }

  void value(pickle::Writer& w, const Value& v, int depth) {
    TORCH_CHECK(depth < kMaxValueDepth, "value nested deeper than ", kMaxValueDepth, " levels");
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, None>) w.none();
          else if constexpr (std::is_same_v<T, bool>) w.boolean(x);
          else if constexpr (std::is_same_v<T, int64_t>) w.integer(x);
          else if constexpr (std::is_same_v<T, double>) w.float64(x);
          else if constexpr (std::is_same_v<T, std::string>) w.str(x);
          else if constexpr (std::is_same_v<T, Bytes>) w.bytes(x.data);
          else if constexpr (std::is_same_v<T, at::Tensor>) tensor(w, x);
          else if constexpr (std::is_same_v<T, ShardedTensor>) {
            TORCH_CHECK(false, "a ShardedTensor inside a non-tensor value (a tuple, or a list ",
                        "without tensors or dicts) cannot be saved; put it in a dict or list");
          }
          else if constexpr (std::is_same_v<T, List>) {
            w.empty_list();
            if (!x.empty()) {
              w.mark();
              for (const auto& item : x) value(w, item, depth + 1);
              w.appends();
            }
          } else if constexpr (std::is_same_v<T, Tuple>) {
            w.begin_tuple(x.items.size());
            for (const auto& item : x.items) value(w, item, depth + 1);
            w.end_tuple(x.items.size());
          } else if constexpr (std::is_same_v<T, std::shared_ptr<Stateful>>) {
            TORCH_CHECK(false, "a Stateful cannot be written as a value: save and load resolve ",
                        "Stateful objects at the top level of the state dict only");
          } else {
            w.empty_dict();
            if (!x.empty()) {
              w.mark();
              for (const auto& [k, item] : x) {
                if (const auto* s = std::get_if<std::string>(&k)) w.str(*s);
                else w.integer(std::get<int64_t>(k));
                value(w, item, depth + 1);
              }
              w.setitems();
            }
          }
        },
        v.variant());
  }

  uint64_t finish(const std::string& data_pkl) {
    uint64_t bytes = data_pkl.size();
    for (const at::Tensor& t : storages_) bytes += t.numel() * t.element_size();
    if (ZipWriter::fits(bytes, storages_.size() + kFixedRecords)) {
      ZipWriter zip(sink_);
      write_records(data_pkl, [&](const std::string& name, const void* data, size_t n) {
        zip.write_record(name, data, n);
      });
      return zip.finish();
    }
    writer_.emplace([this](const void* data, size_t n) -> size_t {
      if (n == 0 || failure_ || abandoned_) return n;
      try {
        if (data == nullptr) {
          std::string zeros(n, '\0');
          sink_(zeros.data(), n);
        } else {
          sink_(data, n);
        }
        written_ += n;
      } catch (...) {
        failure_ = std::current_exception();
      }
      return n;
    });
    write_records(data_pkl, [&](const std::string& name, const void* data, size_t n) {
      writer_->writeRecord(name, data, n);
    });
    writer_->writeEndOfFile();
    if (failure_) std::rethrow_exception(failure_);  // Note [Sink failures]
    return written_;
  }

 private:
  static void int_tuple(pickle::Writer& w, c10::IntArrayRef values) {
    w.begin_tuple(values.size());
    for (int64_t v : values) w.integer(v);
    w.end_tuple(values.size());
  }

  // The records besides the storages: write_records' data.pkl, .format_version,
  // .storage_alignment and byteorder, and the version and .data/serialization_id that
  // ZipWriter::finish (or PyTorchStreamWriter::writeEndOfFile) adds.
  static constexpr uint64_t kFixedRecords = 6;

  // torch.save's records, in its order (writeEndOfFile adds version and serialization id).
  template <typename Write>
  void write_records(const std::string& data_pkl, Write&& write) {
    write("data.pkl", data_pkl.data(), data_pkl.size());
    write(".format_version", "1", 1);
    write(".storage_alignment", "64", 2);
    write("byteorder", "little", 6);
    for (size_t k = 0; k < storages_.size(); ++k) {
      const at::Tensor& t = storages_[k];
      write("data/" + std::to_string(k), t.numel() ? t.data_ptr() : nullptr,
            t.numel() * t.element_size());
    }
  }

  const ByteSink& sink_;
  uint64_t written_ = 0;
  std::exception_ptr failure_;  // the sink's first failure (Note [Sink failures])
  bool abandoned_ = false;
  std::vector<at::Tensor> storages_;
  std::optional<caffe2::serialize::PyTorchStreamWriter> writer_;  // last: destroyed first
};

// ---------------------------------------------------------------------------------------------
// Reading

using pickle::Kind;
using pickle::ObjectPtr;

// Note [Reading records without LibTorch]: an archive is read through its checked zip directory
// (read_zip_directory; Note [Declared sizes]) and the records' local headers, the way
// PyTorchStreamReader reads it: records live in the folder that the directory's first entry
// names, a 'version' (or '.data/version') record holds a decimal number that LibTorch supports
// (kMinSupportedFileFormatVersion..kMaxSupportedFileFormatVersion, after std::stoull's leading
// blanks and '+'), and 'byteorder', when present, says "little". LibTorch's reader did this work
// a second time per record (80,000 small records cost it 7% of a load) and was a second parser
// of hostile bytes: it let std::out_of_range out of its version parse (a fuzz finding). The
// small records read whole (data.pkl, version, byteorder) are checked against their CRC-32.
class ArchiveReader {
 public:
  bool verify_crc32_ = true;  // check whole storages read by tensor()

  explicit ArchiveReader(const ArchiveSource& source) : source_(source) {
    std::vector<ZipEntry> entries = read_zip_directory(source);  // Note [Declared sizes]
    check(!entries.empty(), "the archive holds no records");
    const size_t slash = entries.front().name.find('/');
    check(slash != std::string::npos, "record '", entries.front().name,
          "' is not in a folder: not a torch.save archive");
    const std::string folder = entries.front().name.substr(0, slash + 1);
    for (ZipEntry& entry : entries) {
      if (entry.name.compare(0, folder.size(), folder) != 0) continue;  // never looked up
      std::string name = entry.name.substr(folder.size());
      const auto [it, added] = entries_.emplace(std::move(name), std::move(entry));
      check(added, "record '", folder, it->first, "' appears twice in the zip directory");
    }
    const ZipEntry* version = find(".data/version");
    if (version == nullptr) version = find("version");
    check(version != nullptr, "no 'version' record: not a torch.save archive");
    check_version(small_record(*version));
    if (const ZipEntry* order = find("byteorder")) {
      const std::string value = small_record(*order);
      check(value == "little", "byte order '", value, "' is not supported");
    }
    const ZipEntry* pkl_entry = find("data.pkl");
    check(pkl_entry != nullptr, "no 'data.pkl' record: not a torch.save archive");
    std::string pkl = small_record(*pkl_entry);
    budget_ = kExpansionSlack + kExpansionPerByte * pkl.size();
    tree_.emplace(pickle::unpickle(std::move(pkl), source_.describe() + " data.pkl"));
  }

  ObjectPtr root() const { return tree_->root(); }

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    TORCH_CHECK(false, "corrupt item ", source_.describe(), ": ", c10::str(args...));
  }
  template <typename... Args>
  void check(bool cond, const Args&... args) const {
    if (!cond) fail(args...);
  }

  bool is_tensor(const ObjectPtr& o) const {
    return o->calls("torch._utils", "_rebuild_tensor_v2") ||
           o->calls("torch._utils", "_rebuild_tensor_v3") ||
           o->calls("torch._utils", "_rebuild_parameter");
  }

  // Interprets a _rebuild_tensor_v2/v3 call without reading the storage.
  TensorRecord tensor_record(const ObjectPtr& o, std::string* key_out = nullptr) {
    if (o->calls("torch._utils", "_rebuild_parameter")) {
      check(!o->args()->items().empty(), "_rebuild_parameter without arguments");
      return tensor_record(o->args()->items()[0], key_out);
    }
    const bool v3 = o->calls("torch._utils", "_rebuild_tensor_v3");
    check(is_tensor(o), "expected a tensor, found ", o->kind_name());
    const auto& a = o->args()->items();
    check(a.size() >= (v3 ? 7u : 6u), "tensor rebuild call with ", a.size(), " arguments");
    const ObjectPtr& pid = a[0];
    check(pid->kind == Kind::PersId && pid->args()->kind == Kind::Tuple &&
              pid->args()->items().size() == 5,
          "tensor storage is not a persistent id");
    const auto& s = pid->args()->items();
    check(s[0]->kind == Kind::Str && s[0]->str() == "storage", "persistent id is not a storage");
    check(s[1]->kind == Kind::Global && s[1]->str() == "torch", "unexpected storage class");
    check(s[2]->kind == Kind::Str && s[4]->kind == Kind::Int, "malformed storage tuple");
    TensorRecord r;
    const int64_t numel = s[4]->i();
    check(numel >= 0, "negative storage size");
    if (v3) {
      check(a[6]->kind == Kind::Global && a[6]->str() == "torch", "v3 tensor without a dtype");
      auto dt = dtype_from_python_name(std::string(a[6]->name()));
      check(dt.has_value(), "unsupported dtype torch.", a[6]->name());
      r.dtype = *dt;
      r.storage_bytes = static_cast<uint64_t>(numel);  // UntypedStorage: bytes
    } else {
      auto dt = dtype_from_storage_name(std::string(s[1]->name()));
      check(dt.has_value(), "unsupported storage class torch.", s[1]->name());
      r.dtype = *dt;
      const auto bytes = checked_mul(numel, static_cast<int64_t>(c10::elementSize(r.dtype)));
      check(bytes.has_value(), "storage of ", numel, " elements overflows");
      r.storage_bytes = static_cast<uint64_t>(*bytes);
    }
    check(a[1]->kind == Kind::Int && a[1]->i() >= 0, "bad storage offset");
    r.storage_offset = a[1]->i();
    r.sizes = int_list(a[2], "size");
    r.strides = int_list(a[3], "stride");
    check(r.sizes.size() == r.strides.size(), "size and stride lengths differ");
    const std::string record = "data/" + std::string(s[2]->str());
    const ZipEntry* entry = find(record);
    check(entry != nullptr, "missing record ", record);
    check(entry->size >= r.storage_bytes, "record ", record, " has ", entry->size,
          " bytes, storage needs ", r.storage_bytes);
    r.data_offset = zip_record_data_offset(source_, *entry);
    if (entry->size == r.storage_bytes) r.storage_crc32 = entry->crc32;
    check(r.data_offset <= source_.size() && r.storage_bytes <= source_.size() - r.data_offset,
          "storage ", record, " extends past the item's end");
    // Every element the view can address must lie inside the storage.
    const int64_t itemsize = static_cast<int64_t>(c10::elementSize(r.dtype));
    // Checked arithmetic: sizes and strides come from the file.
    std::optional<int64_t> max_index = r.storage_offset;
    bool empty = false;
    for (size_t d = 0; d < r.sizes.size(); ++d) {
      check(r.sizes[d] >= 0 && r.strides[d] >= 0, "negative size or stride");
      if (r.sizes[d] == 0) {
        empty = true;
      } else if (max_index) {
        const auto step = checked_mul(r.sizes[d] - 1, r.strides[d]);
        max_index = step ? checked_add(*max_index, *step) : std::nullopt;
      }
    }
    if (!empty) {
      const auto end = max_index ? checked_add(*max_index, 1) : std::nullopt;
      const auto end_bytes = end ? checked_mul(*end, itemsize) : std::nullopt;
      check(end_bytes && static_cast<uint64_t>(*end_bytes) <= r.storage_bytes,
            "tensor view reaches past its storage");
    }
    if (key_out) *key_out = std::string(s[2]->str());
    return r;
  }

  at::Tensor tensor(const ObjectPtr& o) {
    std::string key;
    TensorRecord r = tensor_record(o, &key);
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      const int64_t itemsize = static_cast<int64_t>(c10::elementSize(r.dtype));
      at::Tensor storage = at::empty({static_cast<int64_t>(r.storage_bytes) / itemsize},
                                     at::TensorOptions().dtype(r.dtype));
      if (r.storage_bytes) source_.read(r.data_offset, storage.data_ptr(), r.storage_bytes);
      if (verify_crc32_) {
        check_storage_crc32(source_, r, crc32(storage.data_ptr(), r.storage_bytes));
      }
      it = storages_.emplace(key, storage).first;
    }
    return it->second.as_strided(r.sizes, r.strides, r.storage_offset);
  }

  Value value(const ObjectPtr& o, int depth) {
    check(depth < kMaxValueDepth, "value nested deeper than ", kMaxValueDepth, " levels");
    charge(sizeof(Value) + (o->kind == Kind::Str || o->kind == Kind::Bytes ? o->str().size() : 0));
    switch (o->kind) {
      case Kind::None: return None{};
      case Kind::Bool: return o->b;
      case Kind::Int: return o->i();
      case Kind::Float: return o->f();
      case Kind::Str: return std::string(o->str());
      case Kind::Bytes: return Bytes{std::string(o->str())};
      case Kind::Tuple: return Tuple{items(o->items(), depth)};
      case Kind::List: return items(o->items(), depth);
      case Kind::Dict: return dict(o->items(), depth);
      default: break;
    }
    if (is_tensor(o)) return tensor(o);
    if (o->calls("collections", "OrderedDict")) return dict(o->items(), depth);
    if (o->calls("torch", "Size")) {
      check(o->args()->items().size() == 1, "torch.Size takes one tuple");
      return value(o->args()->items()[0], depth + 1);
    }
    if (o->calls("_codecs", "encode")) return Bytes{latin1(o)};
    if (o->calls("builtins", "bytearray") || o->calls("__builtin__", "bytearray")) {
      check(o->args()->items().size() == 1 && o->args()->items()[0]->kind == Kind::Bytes,
            "unsupported bytearray form");
      return Bytes{std::string(o->args()->items()[0]->str())};
    }
    const auto& g = o->callable() ? o->callable() : o;
    fail("unsupported Python object ",
         g->kind == Kind::Global
             ? "'" + std::string(g->str()) + "." + std::string(g->name()) + "'"
             : std::string(o->kind_name()),
         " (dcp reads None, bool, int, float, str, bytes, list, tuple, dict and tensors)");
  }

 private:
  // Note [Expansion budget]: a pickle shares objects through its memo, so a small data.pkl can
  // describe a DAG (x = [x, x], 64 times) whose tree of Values is astronomically large;
  // Python shares the objects, dcp::Value cannot. Every Value built is charged (its size, and
  // a string's bytes) against a budget linear in data.pkl's size; beyond it the record is
  // refused. Bound: kExpansionPerByte x data.pkl bytes + kExpansionSlack.
  static constexpr uint64_t kExpansionPerByte = 64;
  static constexpr uint64_t kExpansionSlack = uint64_t{8} << 20;
  void charge(uint64_t bytes) {
    spent_ += bytes;
    check(spent_ <= budget_, "the value expands to more than ", budget_,
          " bytes of objects (", kExpansionPerByte, " per data.pkl byte + 8 MiB): objects ",
          "shared through the pickle memo are copied per reference in dcp");
  }

  std::vector<int64_t> int_list(const ObjectPtr& o, const char* what) const {
    check(o->kind == Kind::Tuple || o->kind == Kind::List, what, " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& i : o->items()) {
      check(i->kind == Kind::Int, what, " holds a non-int");
      out.push_back(i->i());
    }
    return out;
  }

  std::vector<Value> items(const pickle::Items& objects, int depth) {
    std::vector<Value> out;
    out.reserve(objects.size());
    for (const auto& o : objects) out.push_back(value(o, depth + 1));
    return out;
  }

  Dict dict(const pickle::Items& kv, int depth) {
    Dict out;
    for (size_t k = 0; k + 1 < kv.size(); k += 2) {
      const auto& key = kv[k];
      TORCH_CHECK_NOT_IMPLEMENTED(
          key->kind == Kind::Str || key->kind == Kind::Int, "a dict with a key of Python type ",
          key->kind_name(), " in ", source_.describe(),
          ": dcp's dicts take str and int keys (the value is valid Python, C++ cannot hold it)");
      Key dk = key->kind == Kind::Str ? Key(std::string(key->str())) : Key(key->i());
      out.insert_or_assign(std::move(dk), value(kv[k + 1], depth + 1));
    }
    return out;
  }

  // _codecs.encode(text, 'latin1') -> the original bytes.
  std::string latin1(const ObjectPtr& o) const {
    const auto& a = o->args()->items();
    check(a.size() == 2 && a[0]->kind == Kind::Str && a[1]->kind == Kind::Str &&
              (a[1]->str() == "latin1" || a[1]->str() == "latin-1"),
          "unsupported _codecs.encode call");
    std::string out;
    const std::string_view s = a[0]->str();
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c));
      } else {
        check((c & 0xe0) == 0xc0 && i + 1 < s.size(), "bytes text is not latin-1");
        const auto c2 = static_cast<unsigned char>(s[++i]);
        out.push_back(static_cast<char>(((c & 0x1f) << 6) | (c2 & 0x3f)));
      }
    }
    return out;
  }

  const ZipEntry* find(const std::string& record) const {
    const auto it = entries_.find(record);
    return it == entries_.end() ? nullptr : &it->second;
  }

  // The bytes of a record read whole, checked against its CRC-32.
  std::string small_record(const ZipEntry& entry) const {
    const uint64_t at = zip_record_data_offset(source_, entry);
    std::string bytes(entry.size, '\0');  // at most the item's size (Note [Declared sizes])
    if (!bytes.empty()) source_.read(at, bytes.data(), bytes.size());
    check(crc32(bytes.data(), bytes.size()) == entry.crc32, "record '", entry.name,
          "' at archive bytes [", at, ", ", at + entry.size, ") fails its CRC-32 check");
    return bytes;
  }

  // As PyTorchStreamReader::init (Note [Reading records without LibTorch]).
  void check_version(const std::string& text) const {
    size_t k = 0;
    while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
    if (k < text.size() && text[k] == '+') ++k;
    const size_t first = k;
    uint64_t version = 0;
    constexpr size_t kMaxDigits = 18;  // fits in uint64_t; LibTorch's range is 1..10
    while (k < text.size() && k - first <= kMaxDigits &&
           std::isdigit(static_cast<unsigned char>(text[k]))) {
      version = version * 10 + static_cast<uint64_t>(text[k++] - '0');
    }
    const bool digits =
        k > first && (k == text.size() || !std::isdigit(static_cast<unsigned char>(text[k])));
    check(digits && version >= caffe2::serialize::kMinSupportedFileFormatVersion &&
              version <= caffe2::serialize::kMaxSupportedFileFormatVersion,
          "version record '", text.substr(0, 32), "' is not a torch.save format version (",
          caffe2::serialize::kMinSupportedFileFormatVersion, "..",
          caffe2::serialize::kMaxSupportedFileFormatVersion, ")");
  }

  const ArchiveSource& source_;
  std::optional<pickle::Tree> tree_;  // set by the constructor
  std::map<std::string, at::Tensor> storages_;
  std::map<std::string, ZipEntry> entries_;  // by record name, without the archive's folder
  uint64_t budget_ = 0;  // Note [Expansion budget]
  uint64_t spent_ = 0;
};

}  // namespace

std::optional<RecordGeometry> RecordGeometry::of(uint64_t length, uint64_t data_bytes) {
  if (data_bytes > length) return std::nullopt;
  return RecordGeometry(length, length - data_bytes);
}

ByteRange RecordGeometry::tail() const {
  const uint64_t n = std::max(slack_, std::min(length_, kZipTailRead));
  return {length_ - n, length_};
}

ByteRange RecordGeometry::data(uint64_t first, uint64_t end) const {
  return {first, std::min(length_, slack_ + end)};
}

uint64_t write_tensor_archive(const at::Tensor& tensor, const ByteSink& sink) {
  ArchiveWriter archive(sink);
  pickle::Writer w;
  archive.tensor(w, tensor);
  return archive.finish(w.finish());
}

uint64_t write_value_archive(const Value& value, const ByteSink& sink) {
  ArchiveWriter archive(sink);
  pickle::Writer w;
  archive.value(w, value, 0);
  return archive.finish(w.finish());
}

TensorRecord read_tensor_record(const ArchiveSource& source) {
  ArchiveReader reader(source);
  return reader.tensor_record(reader.root());
}

void check_storage_crc32(const ArchiveSource& source, const TensorRecord& record, uint32_t crc) {
  if (!record.storage_crc32 || *record.storage_crc32 == crc) return;
  std::ostringstream msg;
  msg << std::hex << "corrupt item " << source.describe() << ": tensor data at item byte "
      << std::dec << record.data_offset << " (" << record.storage_bytes
      << " bytes) fails its CRC-32 check (recorded 0x" << std::hex << *record.storage_crc32
      << ", computed 0x" << crc << ")";
  TORCH_CHECK(false, msg.str());
}

at::Tensor read_tensor_archive(const ArchiveSource& source, bool verify_crc32) {
  ArchiveReader reader(source);
  reader.verify_crc32_ = verify_crc32;
  return reader.tensor(reader.root());
}

Value read_value_archive(const ArchiveSource& source, bool verify_crc32) {
  ArchiveReader reader(source);
  reader.verify_crc32_ = verify_crc32;
  return reader.value(reader.root(), 0);
}

}  // namespace dcp::detail
