// Python's format_utils in C++ (see dcp/format_utils.h): torch.save files through the record
// reader and writer of format/torch_save, checkpoints through dcp::load and dcp::save.
#include "dcp/format_utils.h"

#include <c10/util/Exception.h>
#include <fcntl.h>

#include "dcp/checkpoint.h"
#include "dcp/planner.h"
#include "format/torch_save.h"
#include "io/file.h"
#include "storage/file_output.h"
#include "storage/posix_input_file.h"
#include "util/error_context.h"

namespace dcp {
namespace {

std::pair<std::string, std::string> split(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

}  // namespace

Value torch_load(const std::string& torch_save_path) {
  return detail::with_context(
      [&] {
        const auto [dir, name] = split(torch_save_path);
        auto file = std::make_shared<detail::PosixInputFile>(dir, name);
        StorageInfo whole;
        whole.relative_path = name;
        whole.offset = 0;
        whole.length = static_cast<int64_t>(file->size());
        const detail::ItemSource source(file, whole);
        return detail::read_value_archive(source);
      },
      [&] { return "reading torch.save file '" + torch_save_path + "'"; });
}

void torch_save(const Value& value, const std::string& torch_save_path) {
  detail::with_context(
      [&] {
        const std::string tmp = torch_save_path + ".tmp";
        try {
          detail::File file = detail::File::open(tmp, O_WRONLY | O_CREAT | O_TRUNC);
          detail::BufferedFileOutput out(file);
          detail::write_value_archive(value,
                                      [&](const void* data, size_t n) { out.write(data, n); });
          out.finish();
          file.sync();
          file.close();
          detail::rename_file(tmp, torch_save_path);
        } catch (...) {
          detail::remove_file_quietly(tmp);
          throw;
        }
      },
      [&] { return "writing torch.save file '" + torch_save_path + "'"; });
}

void dcp_to_torch_save(const std::string& checkpoint_id, const std::string& torch_save_path) {
  StateDict state;
  LoadOptions options;
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>();
  load(state, checkpoint_id, options);
  torch_save(Value(std::move(state)), torch_save_path);
}

void torch_save_to_dcp(const std::string& torch_save_path, const std::string& checkpoint_id) {
  Value value = torch_load(torch_save_path);
  TORCH_CHECK_VALUE(value.is_dict(), "torch.save file '", torch_save_path, "' holds a ",
                    value.type_name(), ", not a dict: a checkpoint is made from a state dict");
  save(value.dict(), checkpoint_id);
}

}  // namespace dcp
