// `dcp convert` (see commands.h): Python's dcp_to_torch_save / torch_save_to_dcp, and a
// checkpoint to a Hugging Face safetensors model or back (HuggingFaceStorageWriter / Reader).
#include <c10/util/Exception.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "dcp/checkpoint.h"
#include "dcp/filesystem.h"
#include "dcp/format_utils.h"
#include "dcp/hf_storage.h"
#include "dcp/planner.h"

namespace dcp::cli {
namespace {

// Every key of a checkpoint read by `reader`, flattened to its saved keys.
std::vector<std::pair<std::string, Value>> load_everything(StorageReader& reader,
                                                           const std::string& source) {
  StateDict state;
  LoadOptions options;
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>();
  load(state, reader, options, source);
  return flatten_state_dict(state).items;
}

int checkpoint_to_safetensors(const std::string& source, const std::string& destination) {
  FileSystemReader reader;
  StateDict tensors;
  std::vector<std::string> skipped;
  for (auto& [key, value] : load_everything(reader, source)) {
    if (value.is_tensor()) {
      tensors.insert_or_assign(key, std::move(value));
    } else {
      skipped.push_back(key);
    }
  }
  HuggingFaceStorageWriter writer(destination);
  save(tensors, writer, SaveOptions{}, destination);
  std::cout << "wrote Hugging Face model " << destination << " (" << tensors.size()
            << " tensors) from checkpoint " << source << "\n";
  if (!skipped.empty()) {
    std::cout << "left out " << skipped.size()
              << " non-tensor value(s), which safetensors cannot hold:";
    for (const auto& k : skipped) std::cout << " " << k;
    std::cout << "\n";
  }
  return 0;
}

int safetensors_to_checkpoint(const std::string& source, const std::string& destination) {
  HuggingFaceStorageReader reader;
  StateDict tensors;
  for (auto& [key, value] : load_everything(reader, source)) {
    tensors.insert_or_assign(key, std::move(value));
  }
  save(tensors, destination);
  std::cout << "wrote checkpoint " << destination << " (" << tensors.size()
            << " tensors) from Hugging Face model " << source << "\n";
  return 0;
}

}  // namespace

int convert(const std::string& source, const std::string& destination, const std::string& to) {
  namespace fs = std::filesystem;
  TORCH_CHECK(fs::exists(source), "'", source, "' does not exist");
  if (to == "safetensors") {
    TORCH_CHECK(fs::is_directory(source), "'", source, "' is not a checkpoint directory");
    return checkpoint_to_safetensors(source, destination);
  }
  if (to == "dcp" && fs::is_directory(source)) return safetensors_to_checkpoint(source, destination);
  TORCH_CHECK(to.empty() || to == "dcp" || to == "torch", "unknown --to '", to,
              "' (torch, dcp or safetensors)");
  if (fs::is_directory(source)) {
    TORCH_CHECK(to != "dcp", "'", source, "' is a directory: --to dcp converts a Hugging Face ",
                "model directory or a torch.save file");
    dcp_to_torch_save(source, destination);
    std::cout << "wrote torch.save file " << destination << " from checkpoint " << source << "\n";
  } else {
    TORCH_CHECK(to != "torch", "'", source, "' is a file: --to torch converts a checkpoint");
    torch_save_to_dcp(source, destination);
    std::cout << "wrote checkpoint " << destination << " from torch.save file " << source << "\n";
  }
  return 0;
}

}  // namespace dcp::cli
