// dcp::Dims: per-dimension integers of a checkpoint's public types (a chunk's offsets and sizes,
// a tensor's global shape, a read's offsets and lengths). Python keeps these as torch.Size or a
// list of ints; here they are LibTorch's c10::SmallVector with four slots inline, so a chunk of
// a tensor of up to four dimensions takes no heap block of its own (a 5-d one spills to the
// heap, as a std::vector would). A save's or load's plan holds millions of them at scale, and
// their heap blocks, not the format, were what its coordinator paid for (docs/performance.md,
// "Flat dimensions").
//
// It behaves like std::vector<int64_t> (size, [], begin/end, push_back, ==, <) and converts to
// c10::IntArrayRef, so `torch::empty(chunk.sizes)` works. From a std::vector or IntArrayRef,
// build it explicitly: `Dims(t.sizes())`, or assign: `dims = t.sizes()`; the other way,
// `c10::IntArrayRef(dims).vec()`.
//
// Thread-safety: plain data.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

namespace dcp {

using Dims = c10::SmallVector<int64_t, 4>;

}  // namespace dcp
