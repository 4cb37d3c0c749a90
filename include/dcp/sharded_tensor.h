// dcp::ShardedTensor: this rank's pieces of a global tensor (global shape, dtype, and local
// shards, each an at::Tensor with its global offsets), plus helpers that lay tensors out
// exactly as PyTorch's DTensor does (Shard(dim) with torch.chunk's uneven split, Replicate, and
// n-D device meshes), so that checkpoints match Python's chunk for chunk.
//
// Thread-safety: plain data.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace dcp {

/// One local piece of a sharded tensor.
struct Shard {
  at::Tensor tensor;             // this rank's data (any device; saved from CPU copies)
  std::vector<int64_t> offsets;  // global offsets of tensor[0, 0, ...]
};

class ShardedTensor {
 public:
  ShardedTensor() = default;
  /// REQUIRES: every shard has global_shape.size() dimensions, dtype `dtype`, and lies inside
  /// the global shape (zero-size shards may sit at offset == dimension size). Throws otherwise.
  ShardedTensor(std::vector<int64_t> global_shape, c10::ScalarType dtype,
                std::vector<Shard> local_shards);

  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  c10::ScalarType dtype() const { return dtype_; }
  const std::vector<Shard>& local_shards() const { return local_shards_; }
  std::vector<Shard>& local_shards() { return local_shards_; }

  bool operator==(const ShardedTensor& other) const;

 private:
  std::vector<int64_t> global_shape_;
  c10::ScalarType dtype_ = c10::ScalarType::Float;
  std::vector<Shard> local_shards_;
};

/// A DTensor placement along one mesh dimension.
struct Placement {
  enum class Type { kReplicate, kShard, kStridedShard };
  Type type = Type::kReplicate;
  int64_t dim = 0;           // for kShard and kStridedShard
  int64_t split_factor = 1;  // for kStridedShard

  static Placement Replicate() { return Placement{Type::kReplicate, 0, 1}; }
  static Placement Shard(int64_t dim) { return Placement{Type::kShard, dim, 1}; }
  /// DTensor's _StridedShard(dim, split_factor), what FSDP2 uses on top of tensor parallelism
  /// on the same dimension: the dimension is cut into `split_factor` pieces (torch.chunk), each
  /// piece into the mesh dimension's size, and a rank holds its part of every piece.
  static Placement StridedShard(int64_t dim, int64_t split_factor) {
    return Placement{Type::kStridedShard, dim, split_factor};
  }
};

/// The box (global offsets and sizes) the rank at `mesh_coordinate` holds: Python's
/// compute_local_shape_and_global_offset, with torch.chunk's split and empty shards placed at
/// offset = dimension size (docs/format.md §6.6). With _StridedShard placements the rank's
/// indices are computed as DTensor does; when they are not one contiguous range in some
/// dimension (a layout no single chunk can describe) this throws, naming the dimension.
struct LocalBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};
LocalBox compute_local_box(const std::vector<int64_t>& global_shape,
                           const std::vector<int64_t>& mesh_shape,
                           const std::vector<int64_t>& mesh_coordinate,
                           const std::vector<Placement>& placements);

/// Row-major coordinate of `rank` in a mesh of ranks 0..prod(mesh_shape)-1; empty when the rank
/// is not in the mesh.
std::vector<int64_t> mesh_coordinate(const std::vector<int64_t>& mesh_shape, int rank);

/// This rank's piece of `full` (a clone of the slice) under the layout; no shards when the rank
/// is outside the mesh.
ShardedTensor distribute_tensor(const at::Tensor& full, const std::vector<int64_t>& mesh_shape,
                                int rank, const std::vector<Placement>& placements);

/// A zero-filled sharded tensor with the layout's local shape (a destination to load into).
ShardedTensor zeros_sharded(const std::vector<int64_t>& global_shape, c10::ScalarType dtype,
                            const std::vector<int64_t>& mesh_shape, int rank,
                            const std::vector<Placement>& placements);

}  // namespace dcp
