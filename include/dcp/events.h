// What a save or load reports while it runs: events a trainer can feed to its own metrics
// (SaveOptions::on_event, LoadOptions::on_event), and the default logger, which prints one
// line per save or load on the coordinator when DCP_LOG=info (per-rank detail with
// DCP_LOG=debug) or after dcp::set_log_level.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace dcp {

enum class Phase {
  kSave,    // a whole dcp::save (or the background part of an async_save)
  kLoad,    // a whole dcp::load
  kStage,   // async_save: copying the state into staging buffers (the caller is blocked,
            // unless StagingOptions::use_async_staging)
  kPlan,    // local and global planning
  kWrite,   // this rank writing its data files
  kCommit,  // the coordinator writing '.metadata' (the commit)
  kRead,    // this rank reading what it loads
};

/// "save", "load", "stage", "plan", "write", "commit", "read".
const char* phase_name(Phase phase);

struct Event {
  Phase phase = Phase::kSave;
  bool end = false;  // false: the phase starts; true: it ended (successfully or not)
  bool ok = true;    // at the end: whether it succeeded
  int rank = 0;
  int world_size = 1;
  std::string checkpoint_id;  // "" when the storage was given without one
  double seconds = 0;         // at the end: how long the phase took
  /// At the end of kWrite / kRead: this rank's bytes and files. At the end of kSave / kLoad on
  /// the coordinator: every rank's (elsewhere: this rank's). Bytes read are those of the
  /// records the rank reads from (a resharding read may touch less of them).
  int64_t bytes = 0;
  int64_t files = 0;
};

/// Called on the calling thread of the rank (the background thread for an async save's
/// phases after staging, and the staging thread for the end of kStage with
/// StagingOptions::use_async_staging). Must not throw.
using EventHook = std::function<void(const Event&)>;

enum class LogLevel { kOff, kInfo, kDebug };

/// The default logger's level; initially from the environment variable DCP_LOG ("info",
/// "debug"; anything else: off). Lines go to stderr.
void set_log_level(LogLevel level);
LogLevel log_level();

}  // namespace dcp
