// HuggingFaceStorageReader and HuggingFaceStorageWriter: Hugging Face safetensors models as
// checkpoints, as Python's hf_storage.py. The reader loads a Hugging Face model directory (model.safetensors, or
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
#include <map>
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
  const Metadata* metadata_ = nullptr;  // set_up_storage_reader's, owned by its caller
};

struct HuggingFaceStorageWriterOptions {
  /// Tensor FQN -> file index 1..N: the tensor goes to model-0000k-of-0000N.safetensors. Empty:
  /// every tensor in model-00001-of-00001.safetensors. A tensor missing from a non-empty
  /// mapping is an error.
  std::map<std::string, int> fqn_to_index_mapping;
  /// Python's save_distributed: every rank writes its own chunks, to
  /// shard-0000r-model-0000k-of-0000N.safetensors (r = rank + 1), with each chunk's offsets in
  /// the header's __metadata__["DCP_SHARDING_INFO"]; no index file is written. false: one set
  /// of whole tensors, from one rank (a save on one rank or with no_dist), plus
  /// model.safetensors.index.json.
  bool save_distributed = false;
  /// Files each rank writes at once (Python's thread_count): files, not items, are the unit.
  int thread_count = 1;
  /// Python's enable_consolidation: the chunks go to `<path>/sharded/`, and after every rank
  /// wrote them the coordinator assembles whole tensors into `<path>/model-0000k-of-0000N
  /// .safetensors` by fqn_to_index_mapping (all in one file when empty), with
  /// model.safetensors.index.json. The result is an ordinary Hugging Face model directory.
  /// Consolidation holds one whole tensor in memory at a time.
  bool enable_consolidation = false;
  /// Threads that write consolidated files (one file per thread), Python's
  /// thread_count_consolidation.
  int thread_count_consolidation = 1;
  /// fsync every file before the save returns.
  bool sync_files = true;
};

/// Writes a Hugging Face model directory with dcp::save. Tensors only: a non-tensor value is
/// an error naming its key. Files load with the safetensors package and Python's
/// HuggingFaceStorageReader (and dcp's). Not atomic like FileSystemWriter's commit: the files
/// appear as they are written.
class HuggingFaceStorageWriter : public StorageWriter {
 public:
  explicit HuggingFaceStorageWriter(std::string path = "",
                                    HuggingFaceStorageWriterOptions options = {});

  // StorageWriter:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  void set_up_storage_writer(bool is_coordinator, int rank) override;
  SavePlan prepare_local_plan(SavePlan plan) override;
  std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan> plans) override;
  std::future<std::vector<WriteResult>> write_data(const SavePlan& plan,
                                                   SavePlanner& planner) override;
  void finish(const Metadata& metadata,
              const std::vector<std::vector<WriteResult>>& results) override;

 private:
  /// Where write_data puts its files: the path, or its "sharded" folder with consolidation.
  std::string data_directory() const;
  void consolidate(const Metadata& metadata) const;

  std::string path_;
  HuggingFaceStorageWriterOptions options_;
  int rank_ = 0;
};

}  // namespace dcp
