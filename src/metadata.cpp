// Metadata helpers: printing, equality and dtype names.
#include "dcp/metadata.h"

#include "format/dtypes.h"

namespace dcp {

std::ostream& operator<<(std::ostream& os, const MetadataIndex& index) {
  os << "MetadataIndex(fqn='" << index.fqn << "'";
  if (index.offset) {
    os << ", offset=[";
    for (size_t i = 0; i < index.offset->size(); ++i) os << (i ? ", " : "") << (*index.offset)[i];
    os << "]";
  }
  if (index.index) os << ", index=" << *index.index;
  return os << ")";
}

bool Metadata::operator==(const Metadata& o) const {
  if (!(state_dict_metadata == o.state_dict_metadata) || !(planner_data == o.planner_data) ||
      !(storage_meta == o.storage_meta) || !(version == o.version) ||
      storage_data.size() != o.storage_data.size()) {
    return false;
  }
  auto a = storage_data.begin();
  for (auto b = o.storage_data.begin(); b != o.storage_data.end(); ++a, ++b) {
    if (a->first != b->first || a->first.index != b->first.index || !(a->second == b->second)) {
      return false;
    }
  }
  return true;
}

std::string dtype_name(c10::ScalarType dtype) { return detail::python_dtype_name(dtype); }

}  // namespace dcp
