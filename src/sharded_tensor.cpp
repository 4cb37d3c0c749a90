// ShardedTensor and DTensor-compatible layouts.
//
// compute_local_box, for each mesh dimension in order with mesh size k and coordinate c:
//   Replicate: nothing changes;
//   Shard(d):  split the current local size n like torch.chunk: q = ceil(n / k), start = q * c;
//              size = clamp(min(n, start + q) - start, 0), offset += min(start, n);
//              a zero size puts the offset at the global dimension size (current PyTorch).
//   _StridedShard(d, f): DTensor's _StridedShard.local_shard_size_and_offset: the current n
//              indices are cut into f pieces like torch.chunk (p = ceil(n / f)), each piece of
//              length m into k parts (q = ceil(m / k)); the rank keeps part c of every piece.
//              The indices are tracked as lists (Python's shard_dim_to_global_offsets); the box
//              needs them contiguous.
#include "dcp/sharded_tensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

namespace dcp {

ShardedTensor::ShardedTensor(std::vector<int64_t> global_shape, c10::ScalarType dtype,
                             std::vector<Shard> local_shards)
    : global_shape_(std::move(global_shape)), dtype_(dtype), local_shards_(std::move(local_shards)) {
  for (const auto& s : local_shards_) {
    TORCH_CHECK(s.tensor.defined(), "ShardedTensor: undefined shard tensor");
    TORCH_CHECK(s.tensor.dim() == static_cast<int64_t>(global_shape_.size()) &&
                    s.offsets.size() == global_shape_.size(),
                "ShardedTensor: a shard of ", s.tensor.dim(), " dims for a ", global_shape_.size(),
                "-d tensor");
    TORCH_CHECK(s.tensor.scalar_type() == dtype_, "ShardedTensor: shard dtype ",
                s.tensor.scalar_type(), " differs from ", dtype_);
    const bool empty = s.tensor.numel() == 0;
    for (size_t d = 0; d < global_shape_.size(); ++d) {
      TORCH_CHECK(s.offsets[d] >= 0 &&
                      (empty || s.offsets[d] + s.tensor.size(static_cast<int64_t>(d)) <=
                                    global_shape_[d]),
                  "ShardedTensor: shard at offsets ", c10::IntArrayRef(s.offsets), " of shape ",
                  s.tensor.sizes(), " leaves the global shape ", c10::IntArrayRef(global_shape_));
    }
  }
}

bool ShardedTensor::operator==(const ShardedTensor& other) const {
  if (global_shape_ != other.global_shape_ || dtype_ != other.dtype_ ||
      local_shards_.size() != other.local_shards_.size()) {
    return false;
  }
  for (size_t i = 0; i < local_shards_.size(); ++i) {
    const auto& a = local_shards_[i];
    const auto& b = other.local_shards_[i];
    if (a.offsets != b.offsets || a.tensor.sizes() != b.tensor.sizes()) return false;
    if (a.tensor.numel() && !at::equal(a.tensor.cpu(), b.tensor.cpu())) return false;
  }
  return true;
}

std::vector<int64_t> mesh_coordinate(const std::vector<int64_t>& mesh_shape, int rank) {
  int64_t total = 1;
  for (int64_t s : mesh_shape) total *= s;
  if (rank < 0 || rank >= total) return {};
  std::vector<int64_t> coord(mesh_shape.size());
  int64_t r = rank;
  for (size_t i = mesh_shape.size(); i-- > 0;) {
    coord[i] = r % mesh_shape[i];
    r /= mesh_shape[i];
  }
  return coord;
}

namespace {

// compute_local_box with _StridedShard placements: global index lists per sharded dimension.
LocalBox strided_local_box(const std::vector<int64_t>& global_shape,
                           const std::vector<int64_t>& mesh_shape,
                           const std::vector<int64_t>& mesh_coordinate,
                           const std::vector<Placement>& placements) {
  const size_t dims = global_shape.size();
  std::vector<std::optional<std::vector<int64_t>>> indices(dims);  // nullopt: all of 0..n-1
  std::vector<bool> emptied(dims, false);
  LocalBox box{std::vector<int64_t>(dims, 0), global_shape};
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    const Placement& p = placements[m];
    if (p.type == Placement::Type::kReplicate) continue;
    TORCH_CHECK(p.dim >= 0 && p.dim < static_cast<int64_t>(dims), "Shard(", p.dim, ") of a ",
                dims, "-d tensor");
    TORCH_CHECK(p.type != Placement::Type::kStridedShard || p.split_factor >= 1,
                "_StridedShard(", p.dim, ", split_factor=", p.split_factor, ")");
    const int64_t k = mesh_shape[m];
    const int64_t c = mesh_coordinate[m];
    const int64_t n = box.sizes[p.dim];
    std::vector<int64_t> positions;  // positions kept among the current n indices
    auto keep = [&](int64_t begin, int64_t length) {  // part c of k of [begin, begin + length)
      const int64_t q = (length + k - 1) / k;
      const int64_t start = std::min(q * c, length);
      const int64_t end = std::min(q * (c + 1), length);
      for (int64_t i = start; i < end; ++i) positions.push_back(begin + i);
    };
    if (p.type == Placement::Type::kShard) {
      keep(0, n);
    } else {
      const int64_t f = p.split_factor;
      const int64_t piece = (n + f - 1) / f;
      for (int64_t s = 0; s < f; ++s) {
        const int64_t begin = std::min(piece * s, n);
        keep(begin, std::min(piece * (s + 1), n) - begin);
      }
    }
    std::vector<int64_t> next;
    next.reserve(positions.size());
    for (int64_t i : positions) next.push_back(indices[p.dim] ? (*indices[p.dim])[i] : i);
    indices[p.dim] = std::move(next);
    box.sizes[p.dim] = static_cast<int64_t>(positions.size());
    if (positions.empty()) emptied[p.dim] = true;
  }
  for (size_t d = 0; d < dims; ++d) {
    if (!indices[d]) continue;
    if (emptied[d] || indices[d]->empty()) {
      box.offsets[d] = global_shape[d];
      continue;
    }
    const std::vector<int64_t>& idx = *indices[d];
    box.offsets[d] = idx.front();
    for (size_t i = 1; i < idx.size(); ++i) {
      TORCH_CHECK(idx[i] == idx.front() + static_cast<int64_t>(i), "the placements give mesh "
                  "coordinate ", c10::IntArrayRef(mesh_coordinate), " of a tensor of shape ",
                  c10::IntArrayRef(global_shape), " the indices ", idx.front(), ", ..., ",
                  idx[i - 1], ", ", idx[i], ", ... in dimension ", d, ": not one range, so no ",
                  "checkpoint chunk can describe them (with _StridedShard, the mesh dimension ",
                  "that shards first must come after the strided one, as FSDP2 places them)");
    }
  }
  return box;
}

}  // namespace

LocalBox compute_local_box(const std::vector<int64_t>& global_shape,
                           const std::vector<int64_t>& mesh_shape,
                           const std::vector<int64_t>& mesh_coordinate,
                           const std::vector<Placement>& placements) {
  TORCH_CHECK(mesh_shape.size() == placements.size() &&
                  mesh_coordinate.size() == mesh_shape.size(),
              "compute_local_box: one placement and one coordinate per mesh dimension");
  LocalBox box{std::vector<int64_t>(global_shape.size(), 0), global_shape};
  for (const Placement& p : placements) {
    if (p.type == Placement::Type::kStridedShard) {
      return strided_local_box(global_shape, mesh_shape, mesh_coordinate, placements);
    }
  }
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    const Placement& p = placements[m];
    if (p.type == Placement::Type::kReplicate) continue;
    TORCH_CHECK(p.dim >= 0 && p.dim < static_cast<int64_t>(global_shape.size()),
                "Shard(", p.dim, ") of a ", global_shape.size(), "-d tensor");
    const int64_t k = mesh_shape[m];
    const int64_t c = mesh_coordinate[m];
    const int64_t n = box.sizes[p.dim];
    const int64_t q = (n + k - 1) / k;
    const int64_t start = std::min(q * c, n);
    const int64_t size = std::max<int64_t>(0, std::min(n, start + q) - start);
    box.sizes[p.dim] = size;
    box.offsets[p.dim] += start;
    if (size == 0) box.offsets[p.dim] = global_shape[p.dim];
  }
  return box;
}

ShardedTensor distribute_tensor(const at::Tensor& full, const std::vector<int64_t>& mesh_shape,
                                int rank, const std::vector<Placement>& placements) {
  const std::vector<int64_t> shape = full.sizes().vec();
  std::vector<Shard> shards;
  const auto coord = mesh_coordinate(mesh_shape, rank);
  if (!coord.empty()) {
    const LocalBox box = compute_local_box(shape, mesh_shape, coord, placements);
    at::Tensor piece = full;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t start = std::min(box.offsets[d], shape[d]);
      piece = piece.narrow(static_cast<int64_t>(d), start, box.sizes[d]);
    }
    shards.push_back(Shard{piece.clone(at::MemoryFormat::Contiguous), box.offsets});
  }
  return ShardedTensor(shape, full.scalar_type(), std::move(shards));
}

ShardedTensor zeros_sharded(const std::vector<int64_t>& global_shape, c10::ScalarType dtype,
                            const std::vector<int64_t>& mesh_shape, int rank,
                            const std::vector<Placement>& placements) {
  std::vector<Shard> shards;
  const auto coord = mesh_coordinate(mesh_shape, rank);
  if (!coord.empty()) {
    const LocalBox box = compute_local_box(global_shape, mesh_shape, coord, placements);
    shards.push_back(Shard{at::zeros(box.sizes, at::TensorOptions().dtype(dtype)), box.offsets});
  }
  return ShardedTensor(global_shape, dtype, std::move(shards));
}

}  // namespace dcp
