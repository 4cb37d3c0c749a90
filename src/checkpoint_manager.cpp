// dcp::CheckpointManager (dcp/checkpoint_manager.h): step directories under a root, retention,
// resume from the latest committed step.
#include "dcp/checkpoint_manager.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>
#include <set>
#include <sstream>

#include "io/file.h"
#include "storage/directory_lock.h"
#include "storage/paths.h"

namespace dcp {

struct CheckpointManager::Listing {
  std::vector<int64_t> committed;   // ascending
  std::vector<int64_t> incomplete;  // ascending: step directories without .metadata
};

namespace {

Communicator& communicator_of(Communicator* comm, SingleProcessCommunicator& local) {
  return comm != nullptr ? *comm : local;
}

// The coordinator's view of the root.
std::pair<std::vector<int64_t>, std::vector<int64_t>> scan(const std::string& root) {
  std::vector<int64_t> committed, incomplete;
  for (const std::string& name : detail::list_directory(root)) {
    const std::optional<int64_t> step = detail::paths::parse_step_directory(name);
    const std::string dir = detail::join_path(root, name);
    if (!step || !detail::is_directory(dir)) continue;
    const bool done = detail::path_exists(detail::join_path(dir, detail::paths::metadata_file()));
    (done ? committed : incomplete).push_back(*step);
  }
  std::sort(committed.begin(), committed.end());
  std::sort(incomplete.begin(), incomplete.end());
  return {committed, incomplete};
}

std::string encode(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::ostringstream os;
  os << a.size();
  for (int64_t s : a) os << ' ' << s;
  os << ' ' << b.size();
  for (int64_t s : b) os << ' ' << s;
  return os.str();
}

std::vector<int64_t> read_steps(std::istringstream& is) {
  size_t n = 0;
  is >> n;
  std::vector<int64_t> out(n);
  for (auto& s : out) is >> s;
  return out;
}

// Removes one step directory unless a save holds its lock: .metadata first (from then on the
// step is invisible), then the other files, then the directory. Failures are logged, not thrown:
// retention must not fail a save that committed.
void remove_step_directory(const std::string& root, const std::string& dir) {
  try {
    detail::DirectoryLock lock;
    try {
      lock = detail::DirectoryLock::acquire(dir);
    } catch (const c10::Error&) {
      return;  // a save holds it
    }
    if (detail::remove_file(detail::join_path(dir, detail::paths::metadata_file()))) {
      detail::sync_directory(dir);
    }
    for (const std::string& name : detail::list_directory(dir)) {
      if (name == detail::paths::lock_file()) continue;
      const std::string path = detail::join_path(dir, name);
      TORCH_CHECK(!detail::is_directory(path), "it holds a directory, ", path,
                  ", that a checkpoint never has; left alone");
      detail::remove_file(path);
    }
    lock.release();
    detail::remove_directory(dir);
    detail::sync_directory(root);
  } catch (const std::exception& e) {
    std::cerr << "dcp: warning: CheckpointManager could not remove " << dir << ": " << e.what()
              << "\n";
  }
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, CheckpointManagerOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  TORCH_CHECK_VALUE(!root_.empty(), "CheckpointManager: empty root directory");
  TORCH_CHECK_VALUE(options_.save_interval_steps >= 1, "CheckpointManager: save_interval_steps ",
                    "must be at least 1, got ", options_.save_interval_steps);
  TORCH_CHECK_VALUE(options_.keep_last_n >= 0 && options_.keep_every_n_steps >= 0,
                    "CheckpointManager: keep_last_n and keep_every_n_steps must not be negative");
  options_.save_options.comm = options_.comm;
  options_.load_options.comm = options_.comm;
  if (options_.async && !options_.save_options.stager) {
    stager_ = std::make_shared<DefaultStager>();
    options_.save_options.stager = stager_;
  }
  SingleProcessCommunicator local;
  Communicator& comm = communicator_of(options_.comm, local);
  const std::string error = comm.broadcast(
      comm.rank() == options_.save_options.coordinator_rank
          ? [&]() -> std::string {
              try {
                detail::create_directories(root_);
                remove_unneeded(/*incomplete_only=*/true);
                return "";
              } catch (const std::exception& e) {
                return e.what();
              }
            }()
          : std::string(),
      options_.save_options.coordinator_rank);
  TORCH_CHECK(error.empty(), "CheckpointManager: rank ", options_.save_options.coordinator_rank,
              " could not set up ", root_, ": ", error);
}

CheckpointManager::~CheckpointManager() {
  if (!pending_) return;
  try {
    finish_pending();
  } catch (const std::exception& e) {
    std::cerr << "dcp: warning: CheckpointManager: the last async save failed: " << e.what()
              << "\n";
  }
}

bool CheckpointManager::should_save(int64_t step) const {
  return step % options_.save_interval_steps == 0;
}

std::string CheckpointManager::directory(int64_t step) const {
  TORCH_CHECK_VALUE(step >= 0, "CheckpointManager: negative step ", step);
  return detail::join_path(root_, detail::paths::step_directory(step));
}

bool CheckpointManager::save(int64_t step, const StateDict& state, bool force) {
  if (!force && !should_save(step)) return false;
  const std::string dir = directory(step);
  if (pending_) finish_pending();
  if (options_.async) {
    pending_ = async_save(state, dir, options_.save_options);
  } else {
    dcp::save(state, dir, options_.save_options);
    SingleProcessCommunicator local;
    if (communicator_of(options_.comm, local).rank() == options_.save_options.coordinator_rank) {
      remove_unneeded(/*incomplete_only=*/false);
    }
  }
  return true;
}

void CheckpointManager::wait_until_finished() {
  if (pending_) finish_pending();
}

void CheckpointManager::finish_pending() {
  AsyncSaveFuture pending = std::move(*pending_);
  pending_.reset();
  pending.get();  // rethrows the save's error, on every rank alike
  SingleProcessCommunicator local;
  if (communicator_of(options_.comm, local).rank() == options_.save_options.coordinator_rank) {
    remove_unneeded(/*incomplete_only=*/false);
  }
}

void CheckpointManager::remove_unneeded(bool incomplete_only) {
  const auto [committed, incomplete] = scan(root_);
  const int64_t newest = committed.empty() ? -1 : committed.back();
  for (int64_t step : incomplete) {
    // At start-up every uncommitted directory is debris; later only those older than the
    // newest commit (a newer one may belong to a save in flight).
    if (incomplete_only || step < newest) remove_step_directory(root_, directory(step));
  }
  if (incomplete_only || options_.keep_last_n == 0) return;
  std::set<int64_t> keep;
  const size_t n = static_cast<size_t>(options_.keep_last_n);
  for (size_t i = committed.size() > n ? committed.size() - n : 0; i < committed.size(); ++i) {
    keep.insert(committed[i]);
  }
  if (newest >= 0) keep.insert(newest);
  for (int64_t step : committed) {
    if (keep.count(step)) continue;
    if (options_.keep_every_n_steps > 0 && step % options_.keep_every_n_steps == 0) continue;
    remove_step_directory(root_, directory(step));
  }
}

CheckpointManager::Listing CheckpointManager::list() {
  SingleProcessCommunicator local;
  Communicator& comm = communicator_of(options_.comm, local);
  const int coordinator = options_.save_options.coordinator_rank;
  std::string mine;
  if (comm.rank() == coordinator) {
    try {
      const auto [committed, incomplete] = scan(root_);
      mine = "ok " + encode(committed, incomplete);
    } catch (const std::exception& e) {
      mine = std::string("error ") + e.what();
    }
  }
  const std::string seen = comm.broadcast(mine, coordinator);
  TORCH_CHECK(seen.rfind("ok ", 0) == 0, "CheckpointManager: rank ", coordinator,
              " could not list ", root_, ": ", seen.substr(seen.find(' ') + 1));
  std::istringstream is(seen.substr(3));
  Listing out;
  out.committed = read_steps(is);
  out.incomplete = read_steps(is);
  return out;
}

std::vector<int64_t> CheckpointManager::all_steps() {
  if (pending_) finish_pending();
  return list().committed;
}

std::optional<int64_t> CheckpointManager::latest_step() {
  const std::vector<int64_t> steps = all_steps();
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

int64_t CheckpointManager::load(StateDict& state, std::optional<int64_t> step) {
  if (pending_) finish_pending();
  const Listing listing = list();
  if (!step) {
    TORCH_CHECK(!listing.committed.empty(), "CheckpointManager: no committed checkpoint under ",
                root_, listing.incomplete.empty() ? "" : " (only uncommitted step directories)");
    step = listing.committed.back();
  } else {
    TORCH_CHECK(std::binary_search(listing.committed.begin(), listing.committed.end(), *step),
                "CheckpointManager: step ", *step, " has no committed checkpoint under ", root_);
  }
  dcp::load(state, directory(*step), options_.load_options);
  return *step;
}

}  // namespace dcp
