// quoted_names: a list of keys for an error message ("'a', 'b' and 3 more").
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace dcp::detail {

/// The first `max` names, quoted and comma-separated, then "and N more" for the rest.
inline std::string quoted_names(const std::vector<std::string>& names, size_t max = 10) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < max; ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() > max) os << " and " << names.size() - max << " more";
  return os.str();
}

}  // namespace dcp::detail
