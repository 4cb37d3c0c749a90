// StorageWriterWrapper and StorageReaderWrapper: forward every call.
#include "dcp/storage.h"

#include <c10/util/Exception.h>

#include <utility>

namespace dcp {

StorageWriterWrapper::StorageWriterWrapper(std::shared_ptr<StorageWriter> target)
    : target_(std::move(target)) {
  TORCH_CHECK(target_ != nullptr, "StorageWriterWrapper: no target writer");
}

StorageReaderWrapper::StorageReaderWrapper(std::shared_ptr<StorageReader> target)
    : target_(std::move(target)) {
  TORCH_CHECK(target_ != nullptr, "StorageReaderWrapper: no target reader");
}

void StorageWriter::set_up_storage_writer_without_collectives(int rank) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "this StorageWriter cannot save without collectives ",
                              "(SaveOptions::use_collectives = false)");
}

void StorageWriterWrapper::reset(const std::optional<std::string>& checkpoint_id) {
  target_->reset(checkpoint_id);
}
void StorageWriterWrapper::set_up_storage_writer(bool is_coordinator, int rank) {
  target_->set_up_storage_writer(is_coordinator, rank);
}

void StorageWriterWrapper::set_up_storage_writer_without_collectives(int rank) {
  target_->set_up_storage_writer_without_collectives(rank);
}
SavePlan StorageWriterWrapper::prepare_local_plan(SavePlan plan) {
  return target_->prepare_local_plan(std::move(plan));
}
std::vector<SavePlan> StorageWriterWrapper::prepare_global_plan(std::vector<SavePlan> plans) {
  return target_->prepare_global_plan(std::move(plans));
}
std::future<std::vector<WriteResult>> StorageWriterWrapper::write_data(const SavePlan& plan,
                                                                       SavePlanner& planner) {
  return target_->write_data(plan, planner);
}
void StorageWriterWrapper::finish(const Metadata& metadata,
                                  const std::vector<std::vector<WriteResult>>& results) {
  target_->finish(metadata, results);
}
std::optional<StorageMeta> StorageWriterWrapper::storage_meta() { return target_->storage_meta(); }
std::string StorageWriterWrapper::create_visibility_probe() {
  return target_->create_visibility_probe();
}
bool StorageWriterWrapper::sees_visibility_probe(const std::string& probe) {
  return target_->sees_visibility_probe(probe);
}
void StorageWriterWrapper::remove_visibility_probe(const std::string& probe) {
  target_->remove_visibility_probe(probe);
}
std::string StorageWriterWrapper::visibility_probe_advice() {
  return target_->visibility_probe_advice();
}
void StorageWriterWrapper::abort() { target_->abort(); }

void StorageReaderWrapper::reset(const std::optional<std::string>& checkpoint_id) {
  target_->reset(checkpoint_id);
}
Metadata StorageReaderWrapper::read_metadata() { return target_->read_metadata(); }
void StorageReaderWrapper::set_up_storage_reader(const Metadata& metadata, bool is_coordinator,
                                                 int rank) {
  target_->set_up_storage_reader(metadata, is_coordinator, rank);
}
LoadPlan StorageReaderWrapper::prepare_local_plan(LoadPlan plan) {
  return target_->prepare_local_plan(std::move(plan));
}
std::vector<LoadPlan> StorageReaderWrapper::prepare_global_plan(std::vector<LoadPlan> plans) {
  return target_->prepare_global_plan(std::move(plans));
}
std::future<void> StorageReaderWrapper::read_data(const LoadPlan& plan, LoadPlanner& planner) {
  return target_->read_data(plan, planner);
}

}  // namespace dcp
