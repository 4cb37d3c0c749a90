// run_parallel: the IO threads of one save or load. The caller that needs threads starts and
// joins them for the duration of one call; there is no global pool (docs/design.md, Threads).
#pragma once

#include <cstddef>
#include <functional>

namespace dcp::detail {

/// Runs task(0), ..., task(n - 1) on up to `threads` threads, the calling thread being one of
/// them; tasks are handed out in index order. After a task fails no new task starts; the first
/// failure is rethrown once every running task has ended.
void run_parallel(size_t n, int threads, const std::function<void(size_t)>& task);

}  // namespace dcp::detail
