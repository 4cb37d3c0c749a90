// dcp::CheckpointManager (dcp/checkpoint_manager.h): step directories under a root, retention,
// resume from the latest committed step.
#include "dcp/checkpoint_manager.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>
#include <set>
#include <sstream>
#include <system_error>

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

// A step directory that retention no longer keeps, already invisible: its lock, held until its
// files are gone (Note [Background retention]).
struct Retired {
  std::string dir;
  detail::DirectoryLock lock;
};

void warn_not_removed(const std::string& dir, const std::exception& e) {
  std::cerr << "dcp: warning: CheckpointManager could not remove " << dir << ": " << e.what()
            << "\n";
}

// Makes one step directory invisible unless a save holds its lock: takes the lock, then removes
// .metadata (from then on the step is not listed). nullopt when a save holds it or the removal
// failed (logged, not thrown: retention must not fail a save that committed).
std::optional<Retired> retire_step_directory(const std::string& dir) {
  try {
    Retired retired{dir, {}};
    try {
      retired.lock = detail::DirectoryLock::acquire(dir);
    } catch (const c10::Error&) {
      return std::nullopt;  // a save holds it
    }
    if (detail::remove_file(detail::join_path(dir, detail::paths::metadata_file()))) {
      detail::sync_directory(dir);
    }
    return std::optional<Retired>(std::move(retired));
  } catch (const std::exception& e) {
    warn_not_removed(dir, e);
    return std::nullopt;
  }
}

// Removes a retired directory's other files, releases its lock and removes the directory.
// Failures are logged, not thrown: a directory left behind has no .metadata, and the next
// retention removes it as an uncommitted step.
void remove_retired(const std::string& root, Retired retired) {
  try {
    for (const std::string& name : detail::list_directory(retired.dir)) {
      if (name == detail::paths::lock_file()) continue;
      const std::string path = detail::join_path(retired.dir, name);
      TORCH_CHECK(!detail::is_directory(path), "it holds a directory, ", path,
                  ", that a checkpoint never has; left alone");
      detail::remove_file(path);
    }
    retired.lock.release();
    detail::remove_directory(retired.dir);
    detail::sync_directory(root);
  } catch (const std::exception& e) {
    warn_not_removed(retired.dir, e);
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
                join_removal();  // a manager starts on a root without debris
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
  if (pending_) {
    try {
      finish_pending();
    } catch (const std::exception& e) {
      std::cerr << "dcp: warning: CheckpointManager: the last async save failed: " << e.what()
                << "\n";
    }
  }
  join_removal();
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
  join_removal();  // the last retention's files, removed while the caller trained
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
  join_removal();
}

void CheckpointManager::join_removal() {
  if (remover_.joinable()) remover_.join();
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

// Note [Background retention]: freeing a checkpoint's blocks takes the file system time that
// grows with the checkpoint (0.043 s per 230 MiB file on the development VM's ext4, mounted with
// discard; docs/performance.md), and the coordinator would spend it on the training thread
// while every other rank waits at its next collective. So retention decides what goes and
// makes it invisible at once (each directory locked, its .metadata removed: no longer listed,
// never loaded), then removes the files on a background thread that holds the directories'
// locks until they are gone. save() and wait_until_finished() wait for that thread before they
// go on, as does the destructor; a scan of the root (all_steps, load) may run beside it, and
// sees the retired directories, without .metadata, as uncommitted.
void CheckpointManager::remove_unneeded(bool incomplete_only) {
  join_removal();  // never two removals at once, nor a scan beside one that retention acts on
  const auto [committed, incomplete] = scan(root_);
  const int64_t newest = committed.empty() ? -1 : committed.back();
  std::vector<int64_t> remove;
  for (int64_t step : incomplete) {
    // At start-up every uncommitted directory is debris; later only those older than the
    // newest commit (a newer one may belong to a save in flight).
    if (incomplete_only || step < newest) remove.push_back(step);
  }
  if (!incomplete_only && options_.keep_last_n > 0) {
    std::set<int64_t> keep;
    const size_t n = static_cast<size_t>(options_.keep_last_n);
    for (size_t i = committed.size() > n ? committed.size() - n : 0; i < committed.size(); ++i) {
      keep.insert(committed[i]);
    }
    if (newest >= 0) keep.insert(newest);
    for (int64_t step : committed) {
      if (keep.count(step)) continue;
      if (options_.keep_every_n_steps > 0 && step % options_.keep_every_n_steps == 0) continue;
      remove.push_back(step);
    }
  }
  auto retired = std::make_shared<std::vector<Retired>>();
  for (int64_t step : remove) {
    if (auto r = retire_step_directory(directory(step))) retired->push_back(std::move(*r));
  }
  if (retired->empty()) return;
  auto remove_all = [root = root_, retired] {
    for (Retired& r : *retired) remove_retired(root, std::move(r));
  };
  try {
    remover_ = std::thread(remove_all);
  } catch (const std::system_error&) {
    remove_all();  // no thread to be had: remove them here
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
