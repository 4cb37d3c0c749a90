// Helper of AsyncSaveTest.ProcessExitWithASavePendingLeavesNoPartialCheckpoint: starts an
// asynchronous save whose writer is slow, then ends the process at once with _exit (no
// destructors, no waiting), as a crash or a kill would.
//   async_exit_tool <checkpoint_dir>
#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "dcp/dcp.h"

namespace {

class SlowWriter : public dcp::StorageWriterWrapper {
 public:
  explicit SlowWriter(std::shared_ptr<dcp::StorageWriter> target)
      : StorageWriterWrapper(std::move(target)) {}
  std::future<std::vector<dcp::WriteResult>> write_data(const dcp::SavePlan& plan,
                                                        dcp::SavePlanner& planner) override {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    return StorageWriterWrapper::write_data(plan, planner);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  dcp::StateDict sd;
  sd["w"] = at::ones({256, 256});
  auto writer = std::make_shared<SlowWriter>(std::make_unique<dcp::FileSystemWriter>(argv[1]));
  dcp::AsyncSaveFuture pending = dcp::async_save(sd, writer);
  _exit(pending.done() ? 3 : 0);
}
