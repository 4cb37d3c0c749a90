// HuggingFaceStorageReader: loads a Hugging Face model directory (model.safetensors, or
// model-0000k-of-0000n.safetensors with model.safetensors.index.json) with dcp::load, into a
// state of any layout at any world size, as Python's HuggingFaceStorageReader does. Every rank
// reads only the byte ranges its destination needs (safetensors data is raw and row-major), so
// 16 ranks starting from a pretrained checkpoint never read the whole model on one rank.
//
//   dcp::HuggingFaceStorageReader reader("/models/llama-3-8b");
//   dcp::load(state, reader, options);   // keys: the safetensors tensor names
//
// Headers are validated like '.metadata' (size bounded, dtypes known, ranges inside the file and
// disjoint, shapes matching their ranges); file names from the index must stay inside the
// directory. Thread-safety: one reader per rank, driven by one thread.
#pragma once

#include <future>
#include <optional>
#include <string>
#include <vector>

#include "dcp/metadata.h"
#include "dcp/storage.h"

namespace dcp {

struct HuggingFaceStorageReaderOptions {
  /// IO threads per rank.
  int thread_count = 1;
};

class HuggingFaceStorageReader : public StorageReader {
 public:
  explicit HuggingFaceStorageReader(std::string path = "",
                                    HuggingFaceStorageReaderOptions options = {});

  // StorageReader:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  /// One TensorStorageMetadata per tensor (one whole chunk each), storage_data pointing at its
  /// bytes in its file.
  Metadata read_metadata() override;
  void set_up_storage_reader(const Metadata& metadata, bool is_coordinator, int rank) override;
  LoadPlan prepare_local_plan(LoadPlan plan) override;
  std::vector<LoadPlan> prepare_global_plan(std::vector<LoadPlan> plans) override;
  std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) override;

 private:
  std::string path_;
  HuggingFaceStorageReaderOptions options_;
  std::optional<Metadata> metadata_;
};

}  // namespace dcp
