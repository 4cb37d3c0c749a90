// The '.metadata' codec. Encoding follows docs/format.md §2 (the nesting Python's pickle emits for
// the DCP dataclasses). Decoding tries the direct decoder (format/metadata_direct.cpp); where
// it gives up, this file interprets the restricted reader's inert object tree, accepting only
// the closed set of globals of docs/format.md §2. Unknown globals are tolerated only inside
// storage_meta and planner_data, which are informational.
#include "format/metadata_codec.h"

#include <c10/util/Exception.h>

#include "format/dtypes.h"
#include "format/metadata_schema.h"
#include "format/pickle.h"
#include "storage_data.h"
#include "util/name_interner.h"

namespace dcp::detail {
namespace {

using namespace metadata_schema;  // NOLINT(google-build-using-namespace): the format's names

// ---------------------------------------------------------------------------------------------
// Encoding

class Encoder {
 public:
  Encoder() = default;
  Encoder(pickle::Writer::Sink sink, size_t piece_bytes) : w_(std::move(sink), piece_bytes) {}

  std::string encode(const Metadata& md) {
    if (!w_.streaming()) {
      // About 110 bytes per storage entry and per chunk; growing past it only costs a regrow.
      // (A streaming writer's pieces have a fixed size: no walk over the chunks to count.)
      size_t chunks = 0;
      for (const auto& [fqn, entry] : md.state_dict_metadata) {
        if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
          chunks += t->chunks.size();
        }
      }
      w_.reserve(128 * (md.storage_data.size() + chunks) + 4096);
    }
    new_object(metadata_cls_, kMetadataModule, "Metadata");
    w_.empty_dict();
    w_.mark();

    w_.str("state_dict_metadata");
    w_.empty_dict();
    w_.mark();
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      w_.str(fqn);
      if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) tensor_metadata(*t);
      else new_object(bytes_cls_, kMetadataModule, "BytesStorageMetadata");
    }
    w_.setitems();

    w_.str("planner_data");
    if (md.planner_data) {
      w_.empty_dict();
      w_.mark();
      for (const auto& entry : *md.planner_data) {
        w_.str(entry.first);
        const auto& path = entry.second;  // (a structured binding cannot be captured in C++17)
        tuple_of(path.size(), [&](size_t k) {
          if (const auto* s = std::get_if<std::string>(&path[k])) w_.str(*s);
          else w_.integer(std::get<int64_t>(path[k]));
        });
      }
      w_.setitems();
    } else {
      w_.none();
    }

    w_.str("storage_data");
    w_.empty_dict();
    w_.mark();
    for (const auto& [index, info] : md.storage_data) {
      metadata_index(index);
      storage_info(info);
    }
    w_.setitems();

    w_.str("storage_meta");
    if (md.storage_meta) storage_meta(*md.storage_meta);
    else w_.none();

    w_.str("version");
    if (md.version) w_.str(*md.version);
    else w_.none();

    w_.setitems();
    w_.build();
    return w_.finish();
  }

 private:
  using Slot = std::optional<pickle::Writer::MemoIndex>;

  // Constant names and globals repeat once or twice per storage entry: after the first write
  // their memo slot is fetched directly, without a table lookup.
  void name(Slot& slot, const char* text) {
    if (slot) w_.get(*slot);
    else slot = w_.str(text);
  }
  void global(Slot& slot, const char* module, const char* name) {
    if (slot) w_.get(*slot);
    else slot = w_.global(module, name);
  }

  // A str that recurs in runs or cycles (one per storage entry: its fqn, its file): its memo
  // slot is found by the interner's guesses, mostly without hashing.
  struct Recurring {
    NameInterner ids;
    std::vector<pickle::Writer::MemoIndex> slots;
  };
  void recurring(Recurring& r, std::string_view text) {
    auto [id, inserted] = r.ids.intern(text);
    if (inserted) r.slots.push_back(w_.str(text));
    else w_.get(r.slots[id]);
  }

  void new_object(Slot& slot, const char* module, const char* name) {
    global(slot, module, name);
    w_.empty_tuple();
    w_.newobj();
  }

  template <typename F>
  void tuple_of(size_t n, F&& item) {
    w_.begin_tuple(n);
    for (size_t k = 0; k < n; ++k) item(k);
    w_.end_tuple(n);
  }

  void size(c10::IntArrayRef dims) {
    global(torch_size_, "torch", "Size");
    tuple_of(dims.size(), [&](size_t k) { w_.integer(dims[k]); });
    w_.tuple(1);
    w_.reduce();
  }

  void optional_str(const std::optional<std::string>& s) {
    if (s) w_.str(*s);
    else w_.none();
  }

  void tensor_metadata(const TensorStorageMetadata& t) {
    new_object(tensor_cls_, kMetadataModule, "TensorStorageMetadata");
    w_.empty_dict();
    w_.mark();
    w_.str("properties");
    new_object(properties_cls_, kMetadataModule, "TensorProperties");
    w_.mark();
    w_.global("torch", python_dtype_name(t.properties.dtype));
    TORCH_CHECK(t.properties.layout == c10::Layout::Strided, "only strided tensors are supported");
    w_.global("torch", "strided");
    w_.boolean(t.properties.requires_grad);
    w_.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
    w_.integer(static_cast<int64_t>(t.properties.memory_format));
    w_.tuple(1);
    w_.reduce();
    w_.boolean(t.properties.pin_memory);
    w_.tuple_from_mark();
    w_.build();
    w_.str("size");
    size(t.size);
    w_.str("chunks");
    w_.empty_list();
    w_.mark();
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const auto& chunk = t.chunks[c];
      new_object(chunk_cls_, kMetadataModule, "ChunkStorageMetadata");
      w_.empty_dict();
      w_.mark();
      name(offsets_, "offsets");
      size(chunk.offsets);
      name(sizes_, "sizes");
      size(chunk.sizes);
      w_.setitems();
      w_.build();
    }
    w_.appends();
    w_.setitems();
    w_.build();
  }

  void metadata_index(const MetadataIndex& index) {
    new_object(index_cls_, kMetadataModule, "MetadataIndex");
    w_.empty_dict();
    w_.mark();
    name(fqn_, "fqn");
    recurring(fqns_, index.fqn);
    name(index_, "index");
    if (index.index) w_.integer(*index.index);
    else w_.none();
    if (index.offset) {
      name(offset_, "offset");
      size(*index.offset);
    }
    w_.setitems();
    w_.build();
  }

  void storage_info(const StorageInfo& info) {
    new_object(info_cls_, kFilesystemModule, "_StorageInfo");
    w_.empty_dict();
    w_.mark();
    name(relative_path_, "relative_path");
    recurring(paths_, info.relative_path);
    name(offset_, "offset");
    w_.integer(info.offset);
    name(length_, "length");
    w_.integer(info.length);
    if (!info.transform_descriptors.empty()) {
      w_.str("transform_descriptors");
      w_.empty_list();
      w_.mark();
      for (const auto& d : info.transform_descriptors) w_.str(d);
      w_.appends();
    }
    w_.setitems();
    w_.build();
  }

  void storage_meta(const StorageMeta& meta) {
    new_object(storage_meta_cls_, kMetadataModule, "StorageMeta");
    w_.empty_dict();
    w_.mark();
    w_.str("checkpoint_id");
    optional_str(meta.checkpoint_id);
    w_.str("save_id");
    optional_str(meta.save_id);
    w_.str("load_id");
    optional_str(meta.load_id);
    w_.str("modules");
    w_.empty_list();
    w_.mark();
    for (const auto& m : meta.modules) w_.str(m);
    w_.appends();
    w_.setitems();
    w_.build();
  }

  pickle::Writer w_;
  Slot metadata_cls_, bytes_cls_, tensor_cls_, properties_cls_, chunk_cls_, index_cls_,
      info_cls_, storage_meta_cls_, torch_size_;
  Slot offsets_, sizes_, fqn_, index_, offset_, relative_path_, length_;
  Recurring fqns_, paths_;
};

// ---------------------------------------------------------------------------------------------
// Decoding

using pickle::Kind;
using pickle::Object;
using pickle::ObjectPtr;

// Checks build no message unless they fail: a '.metadata' holds millions of values.
class Decoder {
 public:
  // `input_bytes`: the pickle's size, which sets the expansion budget.
  Decoder(const std::string& source, size_t input_bytes)
      : source_(source), budget_(budget_for(input_bytes)) {}

  Metadata decode(ObjectPtr root) {
    expect_instance(root, kMetadataModule, "Metadata", "the root object");
    Metadata md;
    bool saw_state_dict_metadata = false;
    for_each_field(root, "Metadata", [&](std::string_view field, ObjectPtr value) {
      if (field == "state_dict_metadata") {
        saw_state_dict_metadata = true;
        for_each_entry(value, "state_dict_metadata", [&](ObjectPtr k, ObjectPtr v) {
          std::string fqn = as_str(k, "a state_dict_metadata key");
          StorageMetadata entry = storage_metadata(v, fqn);
          md.state_dict_metadata.insert_or_assign(std::move(fqn), std::move(entry));
        });
      } else if (field == "planner_data") {
        md.planner_data = planner_data(value);
      } else if (field == "storage_data") {
        if (value->kind == Kind::None) return;
        md.storage_data = storage_data(value);
      } else if (field == "storage_meta") {
        md.storage_meta = storage_meta(value);
      } else if (field == "version") {
        if (value->kind == Kind::Str) md.version = std::string(value->str());
      }
    });
    if (!saw_state_dict_metadata) fail("Metadata has no state_dict_metadata");
    return md;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    TORCH_CHECK(false, "corrupt checkpoint metadata ", source_, ": ", c10::str(args...));
  }

  static std::string describe(ObjectPtr o) {
    if (o->kind == Kind::Global) {
      return "global '" + std::string(o->str()) + "." + std::string(o->name()) + "'";
    }
    if ((o->kind == Kind::Instance || o->kind == Kind::Reduce) && o->callable()) {
      return std::string(o->kind_name()) + " of '" + std::string(o->callable()->str()) + "." +
             std::string(o->callable()->name()) + "'";
    }
    return o->kind_name();
  }

  static bool is_instance(ObjectPtr o, const char* module, const char* name) {
    return o->kind == Kind::Instance && o->callable()->is_global(module, name);
  }
  // `what` and `fqn` together name the value in the error ("a chunk of" 'w').
  void expect_instance(ObjectPtr o, const char* module, const char* name, const char* what,
                       std::string_view fqn = {}) const {
    if (is_instance(o, module, name)) return;
    if (fqn.empty()) fail(what, " should be ", name, ", found ", describe(o));
    fail(what, " '", fqn, "' should be ", name, ", found ", describe(o));
  }

  // Calls f(key, value) for each entry of a dict; `what` and `suffix` name it in the error.
  template <typename F>
  void for_each_entry(ObjectPtr dict, const char* what, F&& f, const char* suffix = "") const {
    if (dict->kind != Kind::Dict && !dict->calls("collections", "OrderedDict")) {
      fail(what, suffix, " should be a dict, found ", describe(dict));
    }
    const auto& items = dict->items();
    for (size_t k = 0; k + 1 < items.size(); k += 2) f(items[k], items[k + 1]);
  }

  // Calls f(field, value) for each field of a dataclass instance's BUILD state (a dict).
  template <typename F>
  void for_each_field(ObjectPtr obj, const char* cls, F&& f) const {
    if (!obj->state()) return;  // never BUILDt: all defaults
    for_each_entry(
        obj->state(), cls,
        [&](ObjectPtr k, ObjectPtr v) {
          if (k->kind != Kind::Str) {
            fail("a field name of ", cls, " should be a str, found ", describe(k));
          }
          f(k->str(), v);
        },
        " state");
  }

  // Note [Expansion budget] (format/metadata_schema.h): the pickle memo lets a small file refer
  // to one large torch.Size or string from many places; each copy made here is charged, and
  // decoding stops at kExpansionPerByte bytes per input byte plus kExpansionSlack.
  void charge(uint64_t bytes) const {
    spent_ += bytes;
    if (spent_ > budget_) {
      fail("the metadata expands to more than ", budget_, " bytes (", kExpansionPerByte,
           " per input byte + 8 MiB): objects shared through the pickle memo are copied per "
           "reference");
    }
  }

  std::string as_str(ObjectPtr o, const char* what) const {
    if (o->kind != Kind::Str) fail(what, " should be a str, found ", describe(o));
    charge(kStrCharge + o->str().size());
    return std::string(o->str());
  }
  int64_t as_int(ObjectPtr o, const char* what) const {
    if (o->kind != Kind::Int) fail(what, " should be an int, found ", describe(o));
    return o->i();
  }
  bool as_bool(ObjectPtr o, const char* what) const {
    if (o->kind != Kind::Bool) fail(what, " should be a bool, found ", describe(o));
    return o->b;
  }

  // torch.Size((...)) or a plain tuple/list of ints.
  Dims shape(ObjectPtr o, const char* what, std::string_view fqn = {}) const {
    ObjectPtr seq = o;
    if (o->calls("torch", "Size")) {
      if (o->args()->items().size() != 1) fail(what, " '", fqn, "': torch.Size takes one tuple");
      seq = o->args()->items()[0];
    }
    if (seq->kind != Kind::Tuple && seq->kind != Kind::List) {
      fail(what, " '", fqn, "' should be a torch.Size, found ", describe(o));
    }
    if (seq->items().size() > kMaxDims) {
      fail(what, " '", fqn, "' has ", seq->items().size(), " dimensions; at most ", kMaxDims,
           " are supported");
    }
    charge(shape_charge(seq->items().size()));
    Dims dims(seq->items().size());
    for (size_t k = 0; k < dims.size(); ++k) {
      const ObjectPtr item = seq->items()[k];
      if (item->kind != Kind::Int) {
        fail(what, " '", fqn, "' should hold ints, found ", describe(item));
      }
      dims[k] = item->i();
    }
    return dims;
  }

  c10::ScalarType dtype(ObjectPtr o, const std::string& fqn) const {
    if (o->kind != Kind::Global || o->str() != "torch") {
      fail("dtype of '", fqn, "' should be a torch dtype, found ", describe(o));
    }
    auto dt = dtype_from_python_name(std::string(o->name()));
    if (!dt) fail("unsupported dtype torch.", o->name(), " for '", fqn, "'");
    return *dt;
  }

  // torch.strided pickles as the global 'torch strided' (older torch, and dcp) or, in torch
  // 2.13, as torch.serialization._get_layout('torch.strided').
  c10::Layout layout(ObjectPtr o, const std::string& fqn) const {
    std::string name;
    if (o->kind == Kind::Global && o->str() == "torch") {
      name = "torch." + std::string(o->name());
    } else if (o->calls("torch.serialization", "_get_layout") && o->args()->items().size() == 1 &&
               o->args()->items()[0]->kind == Kind::Str) {
      name = std::string(o->args()->items()[0]->str());
    } else {
      fail("layout of '", fqn, "' should be a torch layout, found ", describe(o));
    }
    if (name != "torch.strided") {
      fail("'", fqn, "' has layout ", name, "; only strided tensors are supported");
    }
    return c10::Layout::Strided;
  }

  TensorProperties properties(ObjectPtr o, const std::string& fqn) const {
    if (!is_instance(o, kMetadataModule, "TensorProperties") &&
        !is_instance(o, kLegacyMetadataModule, "TensorProperties")) {
      fail("properties of '", fqn, "' should be TensorProperties, found ", describe(o));
    }
    if (o->state() == nullptr) fail("TensorProperties of '", fqn, "' has no state");
    TensorProperties p;
    if (o->state()->kind == Kind::Tuple) {
      const auto& t = o->state()->items();
      if (t.size() != 5) {
        fail("TensorProperties of '", fqn, "' should be a 5-tuple, has ", t.size(), " items");
      }
      p.dtype = dtype(t[0], fqn);
      p.layout = layout(t[1], fqn);
      p.requires_grad = as_bool(t[2], "requires_grad");
      if (t[3]->kind == Kind::Reduce && t[3]->args()->items().size() == 1 &&
          t[3]->args()->items()[0]->kind == Kind::Int) {
        p.memory_format = static_cast<MemFormatEncoding>(t[3]->args()->items()[0]->i());
      }
      p.pin_memory = as_bool(t[4], "pin_memory");
      return p;
    }
    bool saw_dtype = false;
    for_each_field(o, "TensorProperties", [&](std::string_view field, ObjectPtr v) {
      if (field == "dtype") {
        p.dtype = dtype(v, fqn);
        saw_dtype = true;
      } else if (field == "requires_grad") {
        p.requires_grad = as_bool(v, "requires_grad");
      } else if (field == "pin_memory") {
        p.pin_memory = as_bool(v, "pin_memory");
      }
    });
    if (!saw_dtype) fail("TensorProperties of '", fqn, "' has no dtype");
    return p;
  }

  ChunkStorageMetadata chunk(ObjectPtr o, const std::string& fqn) const {
    expect_instance(o, kMetadataModule, "ChunkStorageMetadata", "a chunk of", fqn);
    ChunkStorageMetadata c;
    bool saw_offsets = false, saw_sizes = false;
    for_each_field(o, "ChunkStorageMetadata", [&](std::string_view field, ObjectPtr v) {
      if (field == "offsets") {
        c.offsets = shape(v, "chunk offsets of", fqn);
        saw_offsets = true;
      } else if (field == "sizes") {
        c.sizes = shape(v, "chunk sizes of", fqn);
        saw_sizes = true;
      }
    });
    if (!saw_offsets || !saw_sizes) fail("a chunk of '", fqn, "' lacks offsets or sizes");
    return c;
  }

  StorageMetadata storage_metadata(ObjectPtr o, const std::string& fqn) const {
    if (is_instance(o, kMetadataModule, "BytesStorageMetadata")) return BytesStorageMetadata{};
    expect_instance(o, kMetadataModule, "TensorStorageMetadata", "the metadata of", fqn);
    TensorStorageMetadata t;
    bool saw_properties = false, saw_size = false, saw_chunks = false;
    for_each_field(o, "TensorStorageMetadata", [&](std::string_view field, ObjectPtr v) {
      if (field == "properties") {
        t.properties = properties(v, fqn);
        saw_properties = true;
      } else if (field == "size") {
        t.size = shape(v, "size of", fqn);
        saw_size = true;
      } else if (field == "chunks") {
        if (v->kind != Kind::List) fail("chunks of '", fqn, "' should be a list");
        t.chunks.reserve(v->items().size());
        for (const ObjectPtr c : v->items()) t.chunks.push_back(chunk(c, fqn));
        saw_chunks = true;
      }
    });
    if (!saw_properties || !saw_size || !saw_chunks) {
      fail("TensorStorageMetadata of '", fqn, "' lacks properties, size or chunks");
    }
    for (const auto& c : t.chunks) {
      if (c.offsets.size() != t.size.size() || c.sizes.size() != t.size.size()) {
        fail("a chunk of '", fqn, "' has ", c.offsets.size(), " offsets and ", c.sizes.size(),
             " sizes for a tensor of ", t.size.size(), " dimensions");
      }
    }
    return t;
  }

  MetadataIndex metadata_index(ObjectPtr o) const {
    expect_instance(o, kMetadataModule, "MetadataIndex", "a storage_data key");
    MetadataIndex index;
    bool saw_fqn = false;
    for_each_field(o, "MetadataIndex", [&](std::string_view field, ObjectPtr v) {
      if (field == "fqn") {
        index.fqn = as_str(v, "MetadataIndex.fqn");
        saw_fqn = true;
      } else if (field == "offset" && v->kind != Kind::None) {
        index.offset = shape(v, "MetadataIndex.offset of", index.fqn);
      } else if (field == "index" && v->kind != Kind::None) {
        index.index = as_int(v, "MetadataIndex.index");
      }
    });
    if (!saw_fqn) fail("a MetadataIndex has no fqn");
    return index;
  }

  StorageInfo storage_info(ObjectPtr o, const MetadataIndex& index) const {
    expect_instance(o, kFilesystemModule, "_StorageInfo", "storage_data of", index.fqn);
    StorageInfo info;
    int seen = 0;
    for_each_field(o, "_StorageInfo", [&](std::string_view field, ObjectPtr v) {
      if (field == "relative_path") {
        info.relative_path = as_str(v, "_StorageInfo.relative_path");
        ++seen;
      } else if (field == "offset") {
        info.offset = as_int(v, "_StorageInfo.offset");
        ++seen;
      } else if (field == "length") {
        info.length = as_int(v, "_StorageInfo.length");
        ++seen;
      } else if (field == "transform_descriptors" && v->kind == Kind::List) {
        for (const ObjectPtr d : v->items()) {
          info.transform_descriptors.push_back(as_str(d, "a transform descriptor"));
        }
      }
    });
    if (seen != 3) {
      fail("_StorageInfo of '", index.fqn, "' lacks relative_path, offset or length");
    }
    if (info.offset < 0 || info.length < 0) {
      fail("_StorageInfo of '", index.fqn, "' has a negative offset or length");
    }
    return info;
  }

  StorageData storage_data(ObjectPtr dict) const {
    StorageDataBuilder out;
    for_each_entry(dict, "storage_data", [&](ObjectPtr k, ObjectPtr v) {
      MetadataIndex index = metadata_index(k);
      StorageInfo info = storage_info(v, index);
      out.add(std::move(index), std::move(info));
    });
    return std::move(out).finish();
  }

  // Informational: anything unexpected inside is dropped rather than rejected.
  std::optional<StorageMeta> storage_meta(ObjectPtr o) const {
    if (!is_instance(o, kMetadataModule, "StorageMeta")) return std::nullopt;
    StorageMeta meta;
    auto text = [&](ObjectPtr v) -> std::optional<std::string> {
      if (v->kind == Kind::Str) return std::string(v->str());
      if (v->kind == Kind::Reduce && v->callable() && is_pathlib_module(v->callable()->str())) {
        std::string path;
        for (const ObjectPtr part : v->args()->items()) {
          if (part->kind != Kind::Str) return std::nullopt;
          append_path_part(path, part->str());
        }
        return path;
      }
      return std::nullopt;
    };
    for_each_field(o, "StorageMeta", [&](std::string_view field, ObjectPtr v) {
      if (field == "checkpoint_id") meta.checkpoint_id = text(v);
      else if (field == "save_id") meta.save_id = text(v);
      else if (field == "load_id") meta.load_id = text(v);
      else if (field == "modules" && v->kind == Kind::List) {
        for (const ObjectPtr m : v->items()) {
          if (m->kind == Kind::Str) meta.modules.emplace_back(m->str());
        }
      }
    });
    return meta;
  }

  std::optional<std::map<std::string, ObjectPath>> planner_data(ObjectPtr o) const {
    if (o->kind != Kind::Dict) return std::nullopt;
    std::map<std::string, ObjectPath> out;
    for (size_t k = 0; k + 1 < o->items().size(); k += 2) {
      const ObjectPtr key = o->items()[k];
      const ObjectPtr path = o->items()[k + 1];
      if (key->kind != Kind::Str || path->kind != Kind::Tuple) return std::nullopt;
      ObjectPath p;
      for (const ObjectPtr item : path->items()) {
        charge(kStrCharge + (item->kind == Kind::Str ? item->str().size() : 0));
        if (item->kind == Kind::Str) p.emplace_back(std::string(item->str()));
        else if (item->kind == Kind::Int) p.emplace_back(item->i());
        else return std::nullopt;
      }
      out.insert_or_assign(out.end(), std::string(key->str()), std::move(p));
    }
    return out;
  }

  const std::string& source_;
  const uint64_t budget_;       // Note [Expansion budget]
  mutable uint64_t spent_ = 0;
};

}  // namespace

std::string encode_metadata(const Metadata& metadata) { return Encoder().encode(metadata); }

void encode_metadata(const Metadata& metadata,
                     const std::function<void(std::string_view)>& sink) {
  // 1 MiB pieces: large enough that the sink's cost per call vanishes, small enough to stay
  // in cache while the sink copies or checksums them.
  Encoder(sink, size_t{1} << 20).encode(metadata);
}

Metadata decode_metadata(const char* data, size_t size, const std::string& source) {
  if (auto metadata = decode_metadata_direct(data, size)) return std::move(*metadata);
  return decode_metadata_tree(data, size, source);
}

Metadata decode_metadata_tree(const char* data, size_t size, const std::string& source) {
  // The tree dies before this returns, so it may point into the caller's bytes.
  const pickle::Tree tree = pickle::unpickle_view(data, size, source);
  return Decoder(source, size).decode(tree.root());
}

}  // namespace dcp::detail
