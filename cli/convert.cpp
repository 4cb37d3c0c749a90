// `dcp convert` (see commands.h): Python's dcp_to_torch_save / torch_save_to_dcp.
#include <c10/util/Exception.h>

#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "dcp/format_utils.h"

namespace dcp::cli {

int convert(const std::string& source, const std::string& destination) {
  namespace fs = std::filesystem;
  TORCH_CHECK(fs::exists(source), "'", source, "' does not exist");
  if (fs::is_directory(source)) {
    dcp_to_torch_save(source, destination);
    std::cout << "wrote torch.save file " << destination << " from checkpoint " << source << "\n";
  } else {
    torch_save_to_dcp(source, destination);
    std::cout << "wrote checkpoint " << destination << " from torch.save file " << source << "\n";
  }
  return 0;
}

}  // namespace dcp::cli
