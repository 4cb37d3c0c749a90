// uuid4: random identifiers for saves (Python's StorageMeta.save_id is a uuid4 string).
#pragma once

#include <string>

namespace dcp::detail {

/// A random (version 4) UUID, "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx".
std::string uuid4();

}  // namespace dcp::detail
