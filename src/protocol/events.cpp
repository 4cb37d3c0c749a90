// Events and the default logger (see dcp/events.h and protocol/events.h).
#include "protocol/events.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dcp {
namespace {

LogLevel level_from_environment() {
  const char* v = std::getenv("DCP_LOG");
  if (v == nullptr) return LogLevel::kOff;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "info") == 0) return LogLevel::kInfo;
  return LogLevel::kOff;
}

std::atomic<LogLevel>& level() {
  static std::atomic<LogLevel> l{level_from_environment()};
  return l;
}

std::string gigabytes(int64_t bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kSave:
      return "save";
    case Phase::kLoad:
      return "load";
    case Phase::kStage:
      return "stage";
    case Phase::kPlan:
      return "plan";
    case Phase::kWrite:
      return "write";
    case Phase::kCommit:
      return "commit";
    case Phase::kRead:
      return "read";
  }
  return "?";
}

void set_log_level(LogLevel l) { level().store(l); }
LogLevel log_level() { return level().load(); }

namespace detail {

EventRecorder::EventRecorder(const EventHook& hook, Phase whole, int rank, int world_size,
                             std::string checkpoint_id, bool is_coordinator)
    : hook_(hook),
      whole_(whole),
      rank_(rank),
      world_size_(world_size),
      checkpoint_id_(std::move(checkpoint_id)),
      is_coordinator_(is_coordinator),
      start_(std::chrono::steady_clock::now()) {
  seconds_.fill(-1);
  emit(make(whole_, false, true, 0, 0, 0));
}

EventRecorder::~EventRecorder() {
  if (!finished_) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    emit(make(whole_, true, false, s, 0, 0));
  }
}

void EventRecorder::begin(Phase phase) {
  began_[static_cast<size_t>(phase)] = std::chrono::steady_clock::now();
  emit(make(phase, false, true, 0, 0, 0));
}

void EventRecorder::end(Phase phase, bool ok, int64_t bytes, int64_t files) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                 began_[static_cast<size_t>(phase)])
                       .count();
  seconds_[static_cast<size_t>(phase)] = s;
  emit(make(phase, true, ok, s, bytes, files));
  if (log_level() == LogLevel::kDebug) {
    std::fprintf(
        stderr, "%s",
        fmt::format(
            "dcp[rank {}]: {} {} in {:.3f} s{}\n", rank_, phase_name(phase), ok ? "done" : "FAILED",
            s, bytes > 0 ? fmt::format(" ({}, {} files)", gigabytes(bytes), files) : std::string())
            .c_str());
  }
}

void EventRecorder::finish(int64_t bytes, int64_t files) {
  finished_ = true;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  seconds_[static_cast<size_t>(whole_)] = s;
  emit(make(whole_, true, true, s, bytes, files));
  if (log_level() != LogLevel::kOff && is_coordinator_) log_summary(bytes, files);
}

Event EventRecorder::make(Phase phase, bool end, bool ok, double seconds, int64_t bytes,
                          int64_t files) const {
  Event e;
  e.phase = phase;
  e.end = end;
  e.ok = ok;
  e.rank = rank_;
  e.world_size = world_size_;
  e.checkpoint_id = checkpoint_id_;
  e.seconds = seconds;
  e.bytes = bytes;
  e.files = files;
  return e;
}

void EventRecorder::emit(const Event& event) const {
  if (hook_) hook_(event);
}

// "dcp: saved 2.06 GB to /ckpt/step_100 in 0.90 s (2.30 GB/s; plan 0.01 s, write 0.85 s,
// commit 0.04 s; 4 ranks, 8 files)"
void EventRecorder::log_summary(int64_t bytes, int64_t files) const {
  const double s = seconds_[static_cast<size_t>(whole_)];
  std::string phases;
  for (Phase p : {Phase::kStage, Phase::kPlan, Phase::kWrite, Phase::kCommit, Phase::kRead}) {
    const double t = seconds_[static_cast<size_t>(p)];
    if (t < 0) continue;
    phases += fmt::format("{}{} {:.2f} s", phases.empty() ? "" : ", ", phase_name(p), t);
  }
  const bool save = whole_ == Phase::kSave;
  const std::string where =
      checkpoint_id_.empty() ? "" : (save ? " to " : " from ") + checkpoint_id_;
  std::fprintf(stderr, "%s",
               fmt::format("dcp: {} {}{} in {:.2f} s ({:.2f} GB/s; {}; {} rank{}, {} files)\n",
                           save ? "saved" : "loaded", gigabytes(bytes), where, s,
                           s > 0 ? bytes / 1e9 / s : 0.0, phases, world_size_,
                           world_size_ == 1 ? "" : "s", files)
                   .c_str());
}

}  // namespace detail
}  // namespace dcp
