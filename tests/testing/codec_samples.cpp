// The codec tests' samples (codec_samples.h).
#include "testing/codec_samples.h"

namespace dcp::testing {

SavePlan sample_save_plan() {
  TensorProperties props;
  props.dtype = c10::ScalarType::BFloat16;
  props.requires_grad = true;
  props.memory_format = MemFormatEncoding::TORCH_CHANNELS_LAST;
  SavePlan plan;
  plan.items.resize(3);
  plan.items[0].type = WriteItemType::BYTE_IO;
  plan.items[0].index = MetadataIndex("step");
  plan.items[1].type = WriteItemType::SHARD;
  plan.items[1].index = MetadataIndex("layers.0.weight", Dims{2, 0}, 7);
  plan.items[1].tensor_data = TensorWriteData{{{2, 0}, {2, 3}}, props, {4, 3}};
  plan.items[2].type = WriteItemType::TENSOR;
  const Dims five{1, 2, 3, 4, 5};  // more dimensions than Dims holds inline
  plan.items[2].index = MetadataIndex("conv3d.weight", Dims(5, 0));
  plan.items[2].tensor_data = TensorWriteData{{Dims(5, 0), five}, TensorProperties{}, five};
  plan.storage_data = "__3_";
  plan.planner_data = PlannerData::Map{
      {"step", ObjectPath{Key("optim"), Key(int64_t{0}), Key("step")}},
      {"layers.0.weight", ObjectPath{Key("layers"), Key(int64_t{0}), Key("weight")}}};
  return plan;
}

std::vector<WriteResult> sample_write_results() {
  const SavePlan plan = sample_save_plan();
  return {{plan.items[0].index, 8, {"__3_0.distcp", 0, 8, {}}},
          {plan.items[1].index, 12, {"__3_0.distcp", 8, 20, {"zstd", "crc32"}}}};
}

ReadItem sample_read_item() {
  ReadItem read;
  read.dest_index = MetadataIndex("conv3d.weight", Dims(5, 0));
  read.dest_offsets = Dims{0, 0, 0, 0, 1};
  read.storage_index = MetadataIndex("conv3d.weight", Dims(5, 0), 0);
  read.storage_offsets = Dims{0, 0, 0, 0, 2};
  read.lengths = Dims{1, 2, 3, 4, 3};
  return read;
}

LoadPlan sample_load_plan() {
  LoadPlan plan;
  plan.items.push_back(sample_read_item());
  plan.items.push_back(ReadItem{LoadItemType::TENSOR, MetadataIndex("model.w", Dims{0}), {0},
                                MetadataIndex("w", Dims{0}, 3), {0}, {4}});
  plan.items.push_back(ReadItem{LoadItemType::BYTE_IO, MetadataIndex("step"), {},
                                MetadataIndex("step"), {}, {}});
  plan.storage_data = "reader";
  return plan;
}

Metadata sample_metadata() {
  Metadata md;
  TensorStorageMetadata w;
  w.properties.dtype = c10::ScalarType::BFloat16;
  w.properties.requires_grad = true;
  w.size = {4, 3};
  w.chunks = {{{0, 0}, {2, 3}}, {{2, 0}, {2, 3}}};
  md.state_dict_metadata["w"] = w;
  TensorStorageMetadata s;
  s.properties.dtype = c10::ScalarType::Long;
  s.chunks = {{{}, {}}};
  md.state_dict_metadata["scalar"] = s;
  md.state_dict_metadata["step"] = BytesStorageMetadata{};
  md.planner_data = std::map<std::string, ObjectPath>{
      {"w", {Key("w")}}, {"step", {Key("optim"), Key(int64_t{0}), Key("step")}}};
  md.storage_data[MetadataIndex("w", std::vector<int64_t>{0, 0}, 0)] = {"__0_0.distcp", 0, 1200, {}};
  md.storage_data[MetadataIndex("w", std::vector<int64_t>{2, 0}, 1)] = {"__1_0.distcp", 0, 1200, {}};
  md.storage_data[MetadataIndex("scalar", std::vector<int64_t>{}, 0)] = {"__0_0.distcp", 1200,
                                                                         int64_t{5} << 32, {}};
  md.storage_data[MetadataIndex("step")] = {"__0_0.distcp", (int64_t{5} << 32) + 1200, 800, {}};
  md.storage_meta = StorageMeta{"/tmp/ckpt", "uuid", std::nullopt, {}};
  md.version = "1.0.0";
  return md;
}

}  // namespace dcp::testing
