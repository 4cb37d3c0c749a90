// A seam under the file layer for fault-injection tests (Note [Fault injection] in
// fault_injection.cpp): every operation of io/file that changes a file system (open for
// writing, write, fallocate, ftruncate, fsync, rename, unlink, mkdir) first asks the installed
// injector, which lets it run, makes it fail with an errno as if the system call had, or ends
// the process there (a crash). Without an injector, the cost is one atomic load.
#pragma once

#include <string>

namespace dcp::detail {

enum class FileOp { kOpen, kWrite, kFallocate, kTruncate, kFsync, kRename, kUnlink, kMkdir };

/// "open", "write", ...
const char* file_op_name(FileOp op);

class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  /// Called before `op` on `path` (any thread); returns 0 to let it run, or the errno it
  /// fails with. May not return (to simulate a crash).
  virtual int before(FileOp op, const std::string& path) = 0;
};

/// Installs `injector` for every thread (nullptr removes it); returns the previous one. The
/// caller keeps it alive while installed.
FaultInjector* set_fault_injector(FaultInjector* injector);

/// What io/file calls before each operation: 0, or the errno to fail with.
int inject_fault(FileOp op, const std::string& path);

}  // namespace dcp::detail
