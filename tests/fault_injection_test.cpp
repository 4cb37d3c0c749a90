// Crash safety of a save (issue #13, "fault injection"), through the seam under the file
// layer (io/fault_injection.h). A save of state B into a directory holding checkpoint A is
// traced once; then, for every file-system operation of that trace in turn (each open for
// writing, write, fallocate, fsync, rename, unlink, mkdir):
//   - fail: the operation returns an errno (EIO, or ENOSPC for writes). The save reports an
//     error, or succeeds when the failure came after the commit; the directory then loads A
//     or B bitwise (B only when the failed operation came after the commit's rename, or the
//     save succeeded), verify finds nothing wrong, and no temporary, probe or unreferenced
//     data file stays behind (unless removing it was what failed);
//   - crash: in a forked child, the process ends at that operation; the directory loads A or
//     B bitwise (A when the crash came before the commit's rename).
// After each, a new save into the directory succeeds and loads. Every layout: direct_io on
// and off, one file per rank and one per item, with a byte item over 4 KiB. Last, the same
// on a real 1 MiB tmpfs that fills up at every point of the save (needs root to mount it,
// which CI has).
#include "io/fault_injection.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "dcp/verify.h"
#include "io/file.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using detail::FileOp;

StateDict state(int64_t seed, int64_t rows) {
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {rows, 16}, seed);
  sd["b"] = testing::make_tensor(at::kLong, {7}, seed + 1);
  sd["note"] = std::string(5000, static_cast<char>('a' + seed));  // a byte item over 4 KiB
  sd["step"] = seed;
  return sd;
}

// Which of `candidates` the checkpoint at `dir` holds, bitwise: its index, or -1.
int loads_as(const std::string& dir, const std::vector<const StateDict*>& candidates) {
  for (size_t k = 0; k < candidates.size(); ++k) {
    StateDict out = testing::blank_like(*candidates[k]);
    try {
      load(out, dir);
    } catch (const c10::Error&) {
      continue;  // not this one (another shape), or not loadable at all
    }
    if (testing::describe_difference(Value(*candidates[k]), Value(out)).empty()) {
      return static_cast<int>(k);
    }
  }
  return -1;
}

struct Op {
  FileOp op;
  std::string path;
};

// Records every operation; fails or crashes at operation `target` (counted from 0).
class Injector : public detail::FaultInjector {
 public:
  enum class Mode { kTrace, kFail, kCrash };
  Injector(Mode mode, size_t target) : mode_(mode), target_(target) {}

  int before(FileOp op, const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t index = ops_.size();
    ops_.push_back(Op{op, path});
    if (mode_ == Mode::kTrace || index != target_) return 0;
    if (mode_ == Mode::kCrash) _exit(kCrashed);
    return op == FileOp::kWrite ? ENOSPC : EIO;
  }
  std::vector<Op> ops() {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_;
  }
  static constexpr int kCrashed = 86;

 private:
  std::mutex mu_;
  std::vector<Op> ops_;
  Mode mode_;
  size_t target_;
};

// Installs an injector for a scope.
class Installed {
 public:
  explicit Installed(detail::FaultInjector* injector) { detail::set_fault_injector(injector); }
  ~Installed() { detail::set_fault_injector(nullptr); }
};

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Files in `dir` that a finished save must not leave: temporaries, probes, the lock, data
// files the committed '.metadata' does not reference.
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> referenced = {".metadata", ".metadata.checksum"};
  try {
    for (const auto& [index, info] : FileSystemReader(dir).read_metadata().storage_data) {
      referenced.push_back(info.relative_path);
    }
  } catch (const c10::Error&) {
  }
  std::vector<std::string> out;
  for (const auto& name : detail::list_directory(dir)) {
    if (std::find(referenced.begin(), referenced.end(), name) == referenced.end()) {
      out.push_back(name);
    }
  }
  return out;
}

void copy_dir(const std::string& from, const std::string& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to);
}

struct Layout {
  const char* name;
  bool direct_io;
  bool single_file_per_rank;
};
const Layout kLayouts[] = {
    {"direct_io_file_per_rank", true, true},
    {"buffered_file_per_rank", false, true},
    {"direct_io_file_per_item", true, false},
    {"buffered_file_per_item", false, false},
};

FileSystemWriterOptions options_of(const Layout& layout) {
  FileSystemWriterOptions o;
  o.direct_io = layout.direct_io;
  o.single_file_per_rank = layout.single_file_per_rank;
  o.thread_count = layout.single_file_per_rank ? 1 : 2;
  return o;
}

void save_with(const StateDict& sd, const std::string& dir, const FileSystemWriterOptions& o) {
  FileSystemWriter writer(dir, o);
  save(sd, writer);
}

// The index of the rename that commits '.metadata' in a trace.
size_t commit_index(const std::vector<Op>& ops) {
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k].op == FileOp::kRename && base_name(ops[k].path) == ".metadata.tmp") return k;
  }
  ADD_FAILURE() << "the trace has no commit";
  return ops.size();
}

// Checkpoint A in `pristine`; the trace of saving B over a copy of it; the commit's index.
class FaultInjection : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    save_with(a, pristine, o);
    copy_dir(pristine, ckpt);
    Injector trace(Injector::Mode::kTrace, 0);
    {
      Installed installed(&trace);
      save_with(b, ckpt, o);
    }
    ops = trace.ops();
    commit = commit_index(ops);
    ASSERT_GT(ops.size(), 8u);
  }
  std::string describe(size_t k) const {
    return std::to_string(k) + " of " + std::to_string(ops.size()) + ": " +
           detail::file_op_name(ops[k].op) + " '" + base_name(ops[k].path) + "'";
  }

  const FileSystemWriterOptions o = options_of(GetParam());
  const StateDict a = state(1, 40), b = state(2, 56), c = state(3, 24);
  testing::TempDir dir;
  const std::string pristine = dir.sub("pristine"), ckpt = dir.sub("ckpt");
  std::vector<Op> ops;
  size_t commit = 0;
};

TEST_P(FaultInjection, EveryFailedOperationLeavesTheOldCheckpointOrTheNewOneWhole) {
  for (size_t k = 0; k < ops.size(); ++k) {
    SCOPED_TRACE("failing operation " + describe(k));
    copy_dir(pristine, ckpt);
    Injector fail(Injector::Mode::kFail, k);
    bool saved = true;
    std::string error;
    {
      Installed installed(&fail);
      try {
        save_with(b, ckpt, o);
      } catch (const c10::Error& e) {
        saved = false;
        error = e.what_without_backtrace();
      }
    }
    const int holds = loads_as(ckpt, {&a, &b});
    if (saved) {
      EXPECT_EQ(holds, 1) << "the save succeeded, but the directory does not hold its state";
    } else {
      EXPECT_NE(error.find(ckpt), std::string::npos) << "the error does not name the file";
      EXPECT_EQ(holds, k > commit ? holds : 0)
          << "a save that failed before its commit changed the checkpoint";
      EXPECT_NE(holds, -1) << "neither checkpoint loads after: " << error;
    }
    EXPECT_TRUE(verify(ckpt).ok());
    // What may stay: the file whose removal failed; and after a failed fsync of the directory
    // right after the commit, the previous checkpoint's files (Note [Re-save]: whether the
    // commit is durable is unknown, so they are kept for the next save to remove).
    std::vector<std::string> left = leftovers(ckpt);
    if (ops[k].op == FileOp::kUnlink) {
      left.erase(std::remove(left.begin(), left.end(), base_name(ops[k].path)), left.end());
    }
    const bool commit_unsure = ops[k].op == FileOp::kFsync && k == commit + 1;
    EXPECT_TRUE(left.empty() || commit_unsure) << "left behind: " << left.front();
    save_with(c, ckpt, o);  // the directory stays usable
    EXPECT_EQ(loads_as(ckpt, {&c}), 0);
    EXPECT_TRUE(leftovers(ckpt).empty());
  }
}

TEST_P(FaultInjection, ACrashAtEveryOperationLeavesTheOldCheckpointOrTheNewOneWhole) {
  std::cout << GetParam().name << ": a crash at each of " << ops.size() << " operations\n";
  for (size_t k = 0; k < ops.size(); ++k) {
    SCOPED_TRACE("crashing at operation " + describe(k));
    copy_dir(pristine, ckpt);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      Injector crash(Injector::Mode::kCrash, k);
      detail::set_fault_injector(&crash);
      try {
        save_with(b, ckpt, o);
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), Injector::kCrashed) << "the child did not reach the crash";
    const int holds = loads_as(ckpt, {&a, &b});
    EXPECT_EQ(holds, k > commit ? holds : 0)
        << "a save that crashed before its commit changed the checkpoint";
    EXPECT_NE(holds, -1) << "neither checkpoint loads";
    EXPECT_TRUE(verify(ckpt).ok());
    save_with(c, ckpt, o);  // the next save recovers the directory and removes the debris
    EXPECT_EQ(loads_as(ckpt, {&c}), 0);
    EXPECT_TRUE(leftovers(ckpt).empty()) << "left behind: " << leftovers(ckpt).front();
  }
}

// A real file system that runs out of space. A filler file takes all but `room` bytes of a
// 1 MiB tmpfs, for every `room` from 0 up to what the save needs, so ENOSPC strikes at each
// point of the save in turn (data, metadata, checksum; with and without O_DIRECT, which tmpfs
// refuses, so the writer falls back to buffered writes).
class Tmpfs {
 public:
  explicit Tmpfs(const std::string& where) : where_(where) {
    std::filesystem::create_directories(where_);
    mounted_ = ::mount("tmpfs", where_.c_str(), "tmpfs", 0, "size=1m") == 0;
    error_ = errno;
  }
  ~Tmpfs() {
    if (mounted_) ::umount(where_.c_str());
  }
  bool mounted() const { return mounted_; }
  int error() const { return error_; }

 private:
  std::string where_;
  bool mounted_ = false;
  int error_ = 0;
};

uint64_t free_bytes(const std::string& dir) { return std::filesystem::space(dir).available; }

TEST_P(FaultInjection, AFullTmpfsAtEveryPointOfTheSaveLosesNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root (CI runs as root)";
  Tmpfs fs(dir.sub("mnt"));
  ASSERT_TRUE(fs.mounted()) << "mount -t tmpfs: " << std::strerror(fs.error());
  const std::string on_tmpfs = dir.sub("mnt/on_tmpfs"), filler = dir.sub("mnt/filler");
  save_with(a, on_tmpfs, o);
  // What the new save takes at most beside the old checkpoint (tmpfs counts whole pages).
  uint64_t needed = 0;
  {
    const std::string probe = dir.sub("mnt/probe");
    const uint64_t before = free_bytes(dir.sub("mnt"));
    save_with(b, probe, o);
    needed = before - free_bytes(dir.sub("mnt"));
    std::filesystem::remove_all(probe);
  }
  int failed = 0, succeeded = 0;
  for (uint64_t room = 0; room <= needed + 4096; room += 4096) {
    SCOPED_TRACE("room for " + std::to_string(room) + " of " + std::to_string(needed) + " bytes");
    std::filesystem::remove(filler);
    const uint64_t avail = free_bytes(dir.sub("mnt"));
    ASSERT_GE(avail, room);
    {
      std::ofstream f(filler, std::ios::binary);
      const std::string page(4096, 'f');
      for (uint64_t n = 0; n + room < avail; n += page.size()) f.write(page.data(), page.size());
    }
    bool saved = true;
    try {
      save_with(b, on_tmpfs, o);
    } catch (const c10::Error& e) {
      saved = false;
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
    }
    (saved ? succeeded : failed)++;
    const int holds = loads_as(on_tmpfs, {&a, &b});
    EXPECT_EQ(holds, saved ? 1 : 0);
    EXPECT_TRUE(leftovers(on_tmpfs).empty()) << "left behind: " << leftovers(on_tmpfs).front();
    if (saved) {  // back to A for the next round, with room to spare
      std::filesystem::remove(filler);
      save_with(a, on_tmpfs, o);
    }
  }
  std::cout << GetParam().name << ": " << failed << " saves ran out of space, " << succeeded
            << " fit (" << needed << " bytes needed)\n";
  EXPECT_GT(failed, 2);
  EXPECT_GT(succeeded, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FaultInjection, ::testing::ValuesIn(kLayouts),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace dcp
