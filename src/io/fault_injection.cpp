// The fault-injection seam (see fault_injection.h).
//
// Note [Fault injection]: LevelDB and RocksDB test crash safety through an Env they can make
// fail; dcp's equivalent is this hook, consulted by io/file before each operation that
// changes the file system. tests/fault_injection_test.cpp counts the operations of a save,
// then fails (or, in a forked child, crashes) at each one in turn and checks that the
// directory still holds the old checkpoint or the new one, whole. The hook is process-wide:
// the operations of every thread (the writer's IO threads included) go through it.
#include "io/fault_injection.h"

#include <atomic>

namespace dcp::detail {
namespace {
std::atomic<FaultInjector*> g_injector{nullptr};
}  // namespace

const char* file_op_name(FileOp op) {
  switch (op) {
    case FileOp::kOpen:
      return "open";
    case FileOp::kWrite:
      return "write";
    case FileOp::kFallocate:
      return "fallocate";
    case FileOp::kTruncate:
      return "ftruncate";
    case FileOp::kFsync:
      return "fsync";
    case FileOp::kRename:
      return "rename";
    case FileOp::kUnlink:
      return "unlink";
    case FileOp::kMkdir:
      return "mkdir";
  }
  return "?";
}

FaultInjector* set_fault_injector(FaultInjector* injector) {
  return g_injector.exchange(injector, std::memory_order_acq_rel);
}

int inject_fault(FileOp op, const std::string& path) {
  FaultInjector* injector = g_injector.load(std::memory_order_acquire);
  return injector == nullptr ? 0 : injector->before(op, path);
}

}  // namespace dcp::detail
