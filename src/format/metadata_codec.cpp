// The '.metadata' codec. Encoding follows reference §2.7 (the nesting Python's pickle emits for
// the DCP dataclasses); decoding interprets the restricted reader's inert object tree and
// accepts only the closed set of globals of reference §2.6. Unknown globals are tolerated only
// inside storage_meta and planner_data, which are informational.
#include "format/metadata_codec.h"

#include <c10/util/Exception.h>

#include "format/dtypes.h"
#include "format/pickle.h"

namespace dcp::detail {
namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kLegacyMetadataModule = "torch.distributed._shard.sharded_tensor.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

// ---------------------------------------------------------------------------------------------
// Encoding

class Encoder {
 public:
  std::string encode(const Metadata& md) {
    new_object(kMetadataModule, "Metadata");
    w_.empty_dict();
    w_.mark();

    w_.str("state_dict_metadata");
    w_.empty_dict();
    w_.mark();
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      w_.str(fqn);
      if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) tensor_metadata(*t);
      else new_object(kMetadataModule, "BytesStorageMetadata");
    }
    w_.setitems();

    w_.str("planner_data");
    if (md.planner_data) {
      w_.empty_dict();
      w_.mark();
      for (const auto& [fqn, path] : *md.planner_data) {
        w_.str(fqn);
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
  void new_object(const char* module, const char* name) {
    w_.global(module, name);
    w_.empty_tuple();
    w_.newobj();
  }

  template <typename F>
  void tuple_of(size_t n, F&& item) {
    w_.begin_tuple(n);
    for (size_t k = 0; k < n; ++k) item(k);
    w_.end_tuple(n);
  }

  void size(const std::vector<int64_t>& dims) {
    w_.global("torch", "Size");
    tuple_of(dims.size(), [&](size_t k) { w_.integer(dims[k]); });
    w_.tuple(1);
    w_.reduce();
  }

  void optional_str(const std::optional<std::string>& s) {
    if (s) w_.str(*s);
    else w_.none();
  }

  void tensor_metadata(const TensorStorageMetadata& t) {
    new_object(kMetadataModule, "TensorStorageMetadata");
    w_.empty_dict();
    w_.mark();
    w_.str("properties");
    new_object(kMetadataModule, "TensorProperties");
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
    for (const auto& chunk : t.chunks) {
      new_object(kMetadataModule, "ChunkStorageMetadata");
      w_.empty_dict();
      w_.mark();
      w_.str("offsets");
      size(chunk.offsets);
      w_.str("sizes");
      size(chunk.sizes);
      w_.setitems();
      w_.build();
    }
    w_.appends();
    w_.setitems();
    w_.build();
  }

  void metadata_index(const MetadataIndex& index) {
    new_object(kMetadataModule, "MetadataIndex");
    w_.empty_dict();
    w_.mark();
    w_.str("fqn");
    w_.str(index.fqn);
    w_.str("index");
    if (index.index) w_.integer(*index.index);
    else w_.none();
    if (index.offset) {
      w_.str("offset");
      size(*index.offset);
    }
    w_.setitems();
    w_.build();
  }

  void storage_info(const StorageInfo& info) {
    new_object(kFilesystemModule, "_StorageInfo");
    w_.empty_dict();
    w_.mark();
    w_.str("relative_path");
    w_.str(info.relative_path);
    w_.str("offset");
    w_.integer(info.offset);
    w_.str("length");
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
    new_object(kMetadataModule, "StorageMeta");
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
};

// ---------------------------------------------------------------------------------------------
// Decoding

using pickle::Kind;
using pickle::Object;
using pickle::ObjectPtr;

class Decoder {
 public:
  explicit Decoder(const std::string& source) : source_(source) {}

  Metadata decode(const ObjectPtr& root) {
    expect_instance(root, kMetadataModule, "Metadata", "the root object");
    Metadata md;
    bool saw_state_dict_metadata = false;
    for_each_field(root, "Metadata", [&](const std::string& field, const ObjectPtr& value) {
      if (field == "state_dict_metadata") {
        saw_state_dict_metadata = true;
        for_each_entry(value, "state_dict_metadata", [&](const ObjectPtr& k, const ObjectPtr& v) {
          const std::string fqn = as_str(k, "a state_dict_metadata key");
          md.state_dict_metadata.emplace(fqn, storage_metadata(v, fqn));
        });
      } else if (field == "planner_data") {
        md.planner_data = planner_data(value);
      } else if (field == "storage_data") {
        if (value->kind == Kind::None) return;
        for_each_entry(value, "storage_data", [&](const ObjectPtr& k, const ObjectPtr& v) {
          MetadataIndex index = metadata_index(k);
          StorageInfo info = storage_info(v, index);
          md.storage_data.insert_or_assign(std::move(index), std::move(info));
        });
      } else if (field == "storage_meta") {
        md.storage_meta = storage_meta(value);
      } else if (field == "version") {
        if (value->kind == Kind::Str) md.version = value->str;
      }
    });
    check(saw_state_dict_metadata, "Metadata has no state_dict_metadata");
    return md;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    TORCH_CHECK(false, "corrupt checkpoint metadata ", source_, ": ", c10::str(args...));
  }
  template <typename... Args>
  void check(bool cond, const Args&... args) const {
    if (!cond) fail(args...);
  }

  std::string describe(const ObjectPtr& o) const {
    if (o->kind == Kind::Global) return "global '" + o->str + "." + o->name + "'";
    if ((o->kind == Kind::Instance || o->kind == Kind::Reduce) && o->callable)
      return std::string(o->kind_name()) + " of '" + o->callable->str + "." + o->callable->name +
             "'";
    return o->kind_name();
  }

  bool is_instance(const ObjectPtr& o, const char* module, const char* name) const {
    return o->kind == Kind::Instance && o->callable->is_global(module, name);
  }
  void expect_instance(const ObjectPtr& o, const char* module, const char* name,
                       const std::string& what) const {
    check(is_instance(o, module, name), what, " should be ", name, ", found ", describe(o));
  }

  template <typename F>
  void for_each_entry(const ObjectPtr& dict, const std::string& what, F&& f) const {
    const bool ordered_dict = dict->calls("collections", "OrderedDict");
    check(dict->kind == Kind::Dict || ordered_dict, what, " should be a dict, found ",
          describe(dict));
    for (size_t k = 0; k + 1 < dict->items.size(); k += 2) f(dict->items[k], dict->items[k + 1]);
  }

  // Calls f(field, value) for each field of a dataclass instance's BUILD state (a dict).
  template <typename F>
  void for_each_field(const ObjectPtr& obj, const char* cls, F&& f) const {
    if (!obj->state) return;  // never BUILDt: all defaults
    for_each_entry(obj->state, std::string(cls) + " state",
                   [&](const ObjectPtr& k, const ObjectPtr& v) {
                     f(as_str(k, std::string("a field name of ") + cls), v);
                   });
  }

  std::string as_str(const ObjectPtr& o, const std::string& what) const {
    check(o->kind == Kind::Str, what, " should be a str, found ", describe(o));
    return o->str;
  }
  int64_t as_int(const ObjectPtr& o, const std::string& what) const {
    check(o->kind == Kind::Int, what, " should be an int, found ", describe(o));
    return o->i;
  }
  bool as_bool(const ObjectPtr& o, const std::string& what) const {
    check(o->kind == Kind::Bool, what, " should be a bool, found ", describe(o));
    return o->b;
  }

  // torch.Size((...)) or a plain tuple/list of ints.
  std::vector<int64_t> shape(const ObjectPtr& o, const std::string& what) const {
    const Object* seq = o.get();
    if (o->calls("torch", "Size")) {
      check(o->args->items.size() == 1, what, ": torch.Size takes one tuple");
      seq = o->args->items[0].get();
    }
    check(seq->kind == Kind::Tuple || seq->kind == Kind::List, what,
          " should be a torch.Size, found ", describe(o));
    std::vector<int64_t> dims;
    dims.reserve(seq->items.size());
    for (const auto& item : seq->items) dims.push_back(as_int(item, what));
    return dims;
  }

  c10::ScalarType dtype(const ObjectPtr& o, const std::string& fqn) const {
    check(o->kind == Kind::Global && o->str == "torch", "dtype of '", fqn,
          "' should be a torch dtype, found ", describe(o));
    auto dt = dtype_from_python_name(o->name);
    check(dt.has_value(), "unsupported dtype torch.", o->name, " for '", fqn, "'");
    return *dt;
  }

  // torch.strided pickles as the global 'torch strided' (older torch, and dcp) or, in torch
  // 2.13, as torch.serialization._get_layout('torch.strided').
  c10::Layout layout(const ObjectPtr& o, const std::string& fqn) const {
    std::string name;
    if (o->kind == Kind::Global && o->str == "torch") {
      name = "torch." + o->name;
    } else if (o->calls("torch.serialization", "_get_layout") && o->args->items.size() == 1 &&
               o->args->items[0]->kind == Kind::Str) {
      name = o->args->items[0]->str;
    } else {
      fail("layout of '", fqn, "' should be a torch layout, found ", describe(o));
    }
    check(name == "torch.strided", "'", fqn, "' has layout ", name,
          "; only strided tensors are supported");
    return c10::Layout::Strided;
  }

  TensorProperties properties(const ObjectPtr& o, const std::string& fqn) const {
    check(is_instance(o, kMetadataModule, "TensorProperties") ||
              is_instance(o, kLegacyMetadataModule, "TensorProperties"),
          "properties of '", fqn, "' should be TensorProperties, found ", describe(o));
    check(o->state != nullptr, "TensorProperties of '", fqn, "' has no state");
    TensorProperties p;
    if (o->state->kind == Kind::Tuple) {
      const auto& t = o->state->items;
      check(t.size() == 5, "TensorProperties of '", fqn, "' should be a 5-tuple, has ",
            t.size(), " items");
      p.dtype = dtype(t[0], fqn);
      p.layout = layout(t[1], fqn);
      p.requires_grad = as_bool(t[2], "requires_grad");
      if (t[3]->kind == Kind::Reduce && t[3]->args->items.size() == 1 &&
          t[3]->args->items[0]->kind == Kind::Int) {
        p.memory_format = static_cast<MemFormatEncoding>(t[3]->args->items[0]->i);
      }
      p.pin_memory = as_bool(t[4], "pin_memory");
      return p;
    }
    bool saw_dtype = false;
    for_each_field(o, "TensorProperties", [&](const std::string& field, const ObjectPtr& v) {
      if (field == "dtype") {
        p.dtype = dtype(v, fqn);
        saw_dtype = true;
      } else if (field == "requires_grad") {
        p.requires_grad = as_bool(v, "requires_grad");
      } else if (field == "pin_memory") {
        p.pin_memory = as_bool(v, "pin_memory");
      }
    });
    check(saw_dtype, "TensorProperties of '", fqn, "' has no dtype");
    return p;
  }

  ChunkStorageMetadata chunk(const ObjectPtr& o, const std::string& fqn) const {
    expect_instance(o, kMetadataModule, "ChunkStorageMetadata", "a chunk of '" + fqn + "'");
    ChunkStorageMetadata c;
    bool saw_offsets = false, saw_sizes = false;
    for_each_field(o, "ChunkStorageMetadata", [&](const std::string& field, const ObjectPtr& v) {
      if (field == "offsets") {
        c.offsets = shape(v, "chunk offsets of '" + fqn + "'");
        saw_offsets = true;
      } else if (field == "sizes") {
        c.sizes = shape(v, "chunk sizes of '" + fqn + "'");
        saw_sizes = true;
      }
    });
    check(saw_offsets && saw_sizes, "a chunk of '", fqn, "' lacks offsets or sizes");
    return c;
  }

  StorageMetadata storage_metadata(const ObjectPtr& o, const std::string& fqn) const {
    if (is_instance(o, kMetadataModule, "BytesStorageMetadata")) return BytesStorageMetadata{};
    expect_instance(o, kMetadataModule, "TensorStorageMetadata",
                    "the metadata of '" + fqn + "'");
    TensorStorageMetadata t;
    bool saw_properties = false, saw_size = false, saw_chunks = false;
    for_each_field(o, "TensorStorageMetadata", [&](const std::string& field, const ObjectPtr& v) {
      if (field == "properties") {
        t.properties = properties(v, fqn);
        saw_properties = true;
      } else if (field == "size") {
        t.size = shape(v, "size of '" + fqn + "'");
        saw_size = true;
      } else if (field == "chunks") {
        check(v->kind == Kind::List, "chunks of '", fqn, "' should be a list");
        for (const auto& c : v->items) t.chunks.push_back(chunk(c, fqn));
        saw_chunks = true;
      }
    });
    check(saw_properties && saw_size && saw_chunks, "TensorStorageMetadata of '", fqn,
          "' lacks properties, size or chunks");
    for (const auto& c : t.chunks) {
      check(c.offsets.size() == t.size.size() && c.sizes.size() == t.size.size(), "a chunk of '",
            fqn, "' has ", c.offsets.size(), " offsets and ", c.sizes.size(),
            " sizes for a tensor of ", t.size.size(), " dimensions");
    }
    return t;
  }

  MetadataIndex metadata_index(const ObjectPtr& o) const {
    expect_instance(o, kMetadataModule, "MetadataIndex", "a storage_data key");
    MetadataIndex index;
    bool saw_fqn = false;
    for_each_field(o, "MetadataIndex", [&](const std::string& field, const ObjectPtr& v) {
      if (field == "fqn") {
        index.fqn = as_str(v, "MetadataIndex.fqn");
        saw_fqn = true;
      } else if (field == "offset" && v->kind != Kind::None) {
        index.offset = shape(v, "MetadataIndex.offset");
      } else if (field == "index" && v->kind != Kind::None) {
        index.index = as_int(v, "MetadataIndex.index");
      }
    });
    check(saw_fqn, "a MetadataIndex has no fqn");
    return index;
  }

  StorageInfo storage_info(const ObjectPtr& o, const MetadataIndex& index) const {
    expect_instance(o, kFilesystemModule, "_StorageInfo",
                    "storage_data of '" + index.fqn + "'");
    StorageInfo info;
    int seen = 0;
    for_each_field(o, "_StorageInfo", [&](const std::string& field, const ObjectPtr& v) {
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
        for (const auto& d : v->items) {
          info.transform_descriptors.push_back(as_str(d, "a transform descriptor"));
        }
      }
    });
    check(seen == 3, "_StorageInfo of '", index.fqn, "' lacks relative_path, offset or length");
    check(info.offset >= 0 && info.length >= 0, "_StorageInfo of '", index.fqn,
          "' has a negative offset or length");
    return info;
  }

  // Informational: anything unexpected inside is dropped rather than rejected.
  std::optional<StorageMeta> storage_meta(const ObjectPtr& o) const {
    if (!is_instance(o, kMetadataModule, "StorageMeta")) return std::nullopt;
    StorageMeta meta;
    auto text = [&](const ObjectPtr& v) -> std::optional<std::string> {
      if (v->kind == Kind::Str) return v->str;
      if (v->kind == Kind::Reduce && v->callable &&
          (v->callable->str == "pathlib" || v->callable->str == "pathlib._local")) {
        std::string path;
        for (const auto& part : v->args->items) {
          if (part->kind != Kind::Str) return std::nullopt;
          if (!path.empty() && path.back() != '/') path += '/';
          path += part->str;
        }
        return path;
      }
      return std::nullopt;
    };
    for_each_field(o, "StorageMeta", [&](const std::string& field, const ObjectPtr& v) {
      if (field == "checkpoint_id") meta.checkpoint_id = text(v);
      else if (field == "save_id") meta.save_id = text(v);
      else if (field == "load_id") meta.load_id = text(v);
      else if (field == "modules" && v->kind == Kind::List) {
        for (const auto& m : v->items) {
          if (m->kind == Kind::Str) meta.modules.push_back(m->str);
        }
      }
    });
    return meta;
  }

  std::optional<std::map<std::string, ObjectPath>> planner_data(const ObjectPtr& o) const {
    if (o->kind != Kind::Dict) return std::nullopt;
    std::map<std::string, ObjectPath> out;
    for (size_t k = 0; k + 1 < o->items.size(); k += 2) {
      const auto& key = o->items[k];
      const auto& path = o->items[k + 1];
      if (key->kind != Kind::Str || path->kind != Kind::Tuple) return std::nullopt;
      ObjectPath p;
      for (const auto& item : path->items) {
        if (item->kind == Kind::Str) p.emplace_back(item->str);
        else if (item->kind == Kind::Int) p.emplace_back(item->i);
        else return std::nullopt;
      }
      out.emplace(key->str, std::move(p));
    }
    return out;
  }

  const std::string& source_;
};

}  // namespace

std::string encode_metadata(const Metadata& metadata) { return Encoder().encode(metadata); }

Metadata decode_metadata(const char* data, size_t size, const std::string& source) {
  auto root = pickle::unpickle(data, size, source);
  return Decoder(source).decode(root);
}

}  // namespace dcp::detail
