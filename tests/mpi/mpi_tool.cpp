// The program the MPI tests start under mpirun (tests/CMakeLists.txt, label 'mpi'):
//   mpi_tool save <dir> <layout>       every rank saves its part of testing::sharded_state
//   mpi_tool load <dir> <layout>       every rank loads into a zeroed sharded_state of this
//                                      world and layout and checks it bit for bit
//   mpi_tool fail <dir>                a write failure injected on the last rank must raise on
//                                      every rank naming that rank; the previous checkpoint
//                                      stays loadable
//   mpi_tool nonshared <dir>           each rank saves to its own directory: the shared-storage
//                                      check must fail on every rank before any data is written
//   mpi_tool user-comm <dir>           a save while the caller's communicator carries its own
//                                      messages: the checkpoint's collectives must not mix
//   mpi_tool async <dir>               async saves while the trainer runs MPI collectives on
//                                      MPI_COMM_WORLD and mutates its tensors; then load + check
// Layouts: row, column, mesh2d. Exit code 0 only when every rank succeeded.
#include <mpi.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "dcp/dcp.h"
#include "testing/sharded_state.h"
#include "testing/test_util.h"

namespace {

using dcp::testing::Layout;

Layout parse_layout(const std::string& s) {
  if (s == "row") return Layout::kRow;
  if (s == "column") return Layout::kColumn;
  if (s == "mesh2d") return Layout::kMesh2d;
  TORCH_CHECK(false, "unknown layout ", s);
}

void save_state(dcp::Communicator& comm, const std::string& dir, Layout layout) {
  dcp::StateDict sd = dcp::testing::sharded_state(comm.rank(), comm.size(), layout, false);
  dcp::SaveOptions options;
  options.comm = &comm;
  dcp::save(sd, dir, options);
}

void load_and_check(dcp::Communicator& comm, const std::string& dir, Layout layout) {
  dcp::StateDict sd = dcp::testing::sharded_state(comm.rank(), comm.size(), layout, true);
  dcp::LoadOptions options;
  options.comm = &comm;
  dcp::load(sd, dir, options);
  const std::string diff = dcp::testing::check_sharded_state(sd, comm.rank(), comm.size(), layout);
  TORCH_CHECK(diff.empty(), "MISMATCH ", diff);
}

// Runs fn and returns the error message ("" when it succeeded).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

void fail_case(dcp::Communicator& comm, const std::string& dir) {
  const int bad = comm.size() - 1;
  save_state(comm, dir + "/good", Layout::kRow);
  const std::string msg = error_of([&] {
    dcp::StateDict sd = dcp::testing::sharded_state(comm.rank(), comm.size(), Layout::kRow, false);
    auto real = std::make_shared<dcp::FileSystemWriter>(dir + "/bad");
    dcp::testing::FaultInjectionWriter faulty(
        real, comm.rank() == bad ? dcp::testing::FaultPoint::kWriteData
                                 : dcp::testing::FaultPoint::kNone);
    dcp::SaveOptions options;
    options.comm = &comm;
    dcp::save(sd, faulty, options);
  });
  const std::string expected = "failed on rank " + std::to_string(bad) + " of " +
                               std::to_string(comm.size());
  TORCH_CHECK(msg.find(expected) != std::string::npos && msg.find("injected fault") != std::string::npos,
              "rank ", comm.rank(), " did not report the failure of rank ", bad, ": '", msg, "'");
  TORCH_CHECK(!std::filesystem::exists(dir + "/bad/.metadata"), "a failed save left .metadata");
  load_and_check(comm, dir + "/good", Layout::kColumn);
}

// Issue #13, finding 10: the last rank never enters the save (as if it had died without the
// launcher ending the job). The others fail within their timeout; the coordinator names it.
void timeout_case(dcp::Communicator& comm, const std::string& dir) {
  const int bad = comm.size() - 1;
  // A communicator of its own: after a timeout it is abandoned (Note [Collective deadlines]),
  // so it is deliberately never freed.
  auto* own = new dcp::MpiCommunicator(MPI_COMM_WORLD);
  if (comm.rank() == bad) return;
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] {
    dcp::StateDict sd = dcp::testing::sharded_state(comm.rank(), comm.size(), Layout::kRow, false);
    dcp::SaveOptions options;
    options.comm = own;
    options.timeout = std::chrono::seconds(2);
    dcp::save(sd, dir, options);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TORCH_CHECK(seconds < 60, "rank ", comm.rank(), ": the timeout took ", seconds, " s");
  TORCH_CHECK(msg.find("timed out after 2 s") != std::string::npos, "rank ", comm.rank(),
              ": expected a timeout, got '", msg, "'");
  if (comm.rank() == 0) {
    TORCH_CHECK(msg.find("rank(s) " + std::to_string(bad) + " never arrived") != std::string::npos,
                "the coordinator did not name rank ", bad, ": '", msg, "'");
  }
  TORCH_CHECK(!std::filesystem::exists(dir + "/.metadata"), "a timed-out save left .metadata");
}

void nonshared_case(dcp::Communicator& comm, const std::string& dir) {
  const std::string mine = dir + "/node" + std::to_string(comm.rank());
  const std::string msg = error_of([&] { save_state(comm, mine, Layout::kRow); });
  TORCH_CHECK(msg.find("not shared by all ranks") != std::string::npos, "rank ", comm.rank(),
              ": expected the shared-storage error, got '", msg, "'");
  TORCH_CHECK(!std::filesystem::exists(mine + "/.metadata") &&
                  !std::filesystem::exists(mine + "/__0_0.distcp"),
              "data was written before the shared-storage check failed");
}

// The trainer's own traffic stays on MPI_COMM_WORLD around (and interleaved with) the save.
void user_comm_case(dcp::Communicator& comm, const std::string& dir) {
  int rank = comm.rank();
  int token = rank * 10;
  MPI_Request request;
  // A message the trainer posted before the save and receives after it.
  const int peer = (rank + 1) % comm.size();
  const int from = (rank + comm.size() - 1) % comm.size();
  int received = -1;
  MPI_Irecv(&received, 1, MPI_INT, from, 0, MPI_COMM_WORLD, &request);
  MPI_Send(&token, 1, MPI_INT, peer, 0, MPI_COMM_WORLD);
  save_state(comm, dir, Layout::kRow);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  TORCH_CHECK(received == from * 10, "rank ", rank, ": trainer message corrupted: ", received);
  load_and_check(comm, dir, Layout::kRow);
}

void async_case(dcp::Communicator& comm, const std::string& dir) {
  auto stager = std::make_shared<dcp::DefaultStager>();
  dcp::AsyncSaveOptions options;
  options.comm = &comm;
  options.stager = stager;
  for (int round = 0; round < 3; ++round) {
    dcp::StateDict sd = dcp::testing::sharded_state(comm.rank(), comm.size(), Layout::kRow, false);
    dcp::AsyncSaveFuture pending =
        dcp::async_save(sd, dir + "/round" + std::to_string(round), options);
    // The trainer's own collectives on the caller's communicator, concurrently with the save.
    for (int i = 0; i < 50; ++i) {
      int64_t mine = comm.rank() + i, sum = 0;
      MPI_Allreduce(&mine, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      const int64_t n = comm.size();
      TORCH_CHECK(sum == n * (n - 1) / 2 + n * i, "trainer allreduce corrupted");
    }
    // And it changes its weights at once: the saves must not see that.
    for (auto& [k, v] : sd.at("model").dict()) {
      for (auto& shard : v.get<dcp::ShardedTensor>().local_shards()) shard.tensor.fill_(-1);
    }
    pending.get();
  }
  load_and_check(comm, dir + "/round2", Layout::kColumn);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  at::set_num_threads(1);
  int failed = 0;
  {
    dcp::MpiCommunicator comm(MPI_COMM_WORLD);
    try {
      TORCH_CHECK(argc >= 3, "usage: mpi_tool save|load|fail|nonshared|user-comm <dir> [layout]");
      const std::string command = argv[1];
      const std::string dir = argv[2];
      const Layout layout = argc > 3 ? parse_layout(argv[3]) : Layout::kRow;
      if (command == "save") save_state(comm, dir, layout);
      else if (command == "load") load_and_check(comm, dir, layout);
      else if (command == "fail") fail_case(comm, dir);
      else if (command == "nonshared") nonshared_case(comm, dir);
      else if (command == "timeout") timeout_case(comm, dir);
      else if (command == "user-comm") user_comm_case(comm, dir);
      else if (command == "async") async_case(comm, dir);
      else TORCH_CHECK(false, "unknown command ", command);
    } catch (const c10::Error& e) {
      std::cerr << "rank " << comm.rank() << ": " << e.what_without_backtrace() << "\n";
      failed = 1;
    }
    int any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (comm.rank() == 0) {
      std::cout << (any_failed ? "FAILED" : "OK") << ": mpi_tool";
      for (int i = 1; i < argc; ++i) std::cout << " " << argv[i];
      std::cout << " on " << comm.size() << " ranks\n";
    }
    failed = any_failed;
  }
  MPI_Finalize();
  return failed;
}
