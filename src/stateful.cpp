// Resolving the Stateful values of a state dict (dcp/stateful.h).
#include "dcp/stateful.h"

namespace dcp {

StateDict resolve_stateful(const StateDict& state) {
  StateDict out;
  for (const auto& [key, value] : state) {
    if (value.is_stateful()) {
      const auto& object = value.get<std::shared_ptr<Stateful>>();
      TORCH_CHECK_VALUE(object != nullptr, "state dict key '", key_to_string(key),
                        "' holds a null Stateful");
      out.insert_or_assign(key, object->state_dict());
    } else {
      out.insert_or_assign(key, value);
    }
  }
  return out;
}

bool has_stateful(const StateDict& state) {
  for (const auto& entry : state) {
    if (entry.second.is_stateful()) return true;
  }
  return false;
}

}  // namespace dcp
