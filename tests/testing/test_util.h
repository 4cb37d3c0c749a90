// Shared test kit: deterministic tensors, temporary directories, a fault-injecting storage
// writer, and the state dict used by round-trip and interop tests.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <string>
#include <vector>

#include "dcp/dcp.h"

namespace dcp::testing {

/// A tensor whose element i is f(i) = ((i * 7 + seed) % 251 - 100) / 4 (as float64, then cast;
/// bool: odd f; integers: the integer part). Python's tests/interop/values.py computes the same.
at::Tensor make_tensor(c10::ScalarType dtype, c10::IntArrayRef shape, int64_t seed);

/// The reference state dict of the round-trip and interop tests: every dtype in several
/// shapes (0-d, empty, transposed), a nested model/optimizer dict and non-tensor values.
StateDict reference_state_dict();

/// The same structure with every tensor zeroed and every non-tensor value replaced, to load
/// into.
StateDict blank_like(const StateDict& state);

/// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Where FaultInjectionWriter fails.
enum class FaultPoint { kNone, kWriteData, kResolveData, kFinish };

/// Forwards to a real writer and throws at the chosen point (after the real writer did its
/// part for kWriteData, i.e. data files exist but are not committed).
class FaultInjectionWriter : public StorageWriterWrapper {
 public:
  FaultInjectionWriter(std::shared_ptr<StorageWriter> target, FaultPoint point)
      : StorageWriterWrapper(std::move(target)), point_(point) {}

  std::future<std::vector<WriteResult>> write_data(const SavePlan& plan,
                                                   SavePlanner& planner) override;
  void finish(const Metadata& metadata,
              const std::vector<std::vector<WriteResult>>& results) override;

 private:
  FaultPoint point_;
};

/// A planner that fails resolving the Nth item (a failing tensor copy mid-write).
class FailingSavePlanner : public DefaultSavePlanner {
 public:
  explicit FailingSavePlanner(int fail_at) : fail_at_(fail_at) {}
  WritePayload resolve_data(const WriteItem& item) override;

 private:
  int fail_at_;
  std::atomic<int> calls_{0};
};

/// Recursively compares; on mismatch returns a description of the first difference.
std::string describe_difference(const Value& expected, const Value& actual,
                                const std::string& path = "");

}  // namespace dcp::testing
