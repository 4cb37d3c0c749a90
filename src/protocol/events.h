// EventRecorder: times the phases of one save or load, reports them to the user's hook and,
// at the end, to the default logger (dcp/events.h).
#pragma once

#include <array>
#include <chrono>
#include <string>

#include "dcp/events.h"

namespace dcp::detail {

class EventRecorder {
 public:
  EventRecorder(const EventHook& hook, Phase whole, int rank, int world_size,
                std::string checkpoint_id, bool is_coordinator);
  /// Reports the whole operation's end as failed unless finish() was called.
  ~EventRecorder();

  void begin(Phase phase);
  /// Ends `phase` (begun before); bytes and files as in Event.
  void end(Phase phase, bool ok = true, int64_t bytes = 0, int64_t files = 0);
  /// Ends the whole operation successfully with these totals, and logs it.
  void finish(int64_t bytes, int64_t files);

 private:
  Event make(Phase phase, bool end, bool ok, double seconds, int64_t bytes, int64_t files) const;
  void emit(const Event& event) const;
  void log_summary(int64_t bytes, int64_t files) const;

  const EventHook& hook_;
  Phase whole_;
  int rank_, world_size_;
  std::string checkpoint_id_;
  bool is_coordinator_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::array<std::chrono::steady_clock::time_point, 7> began_{};
  std::array<double, 7> seconds_{};  // -1: not run
};

}  // namespace dcp::detail
