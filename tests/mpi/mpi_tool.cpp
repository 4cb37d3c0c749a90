// The program the MPI tests start under mpirun (tests/CMakeLists.txt, label 'mpi'):
//   mpi_tool save <dir> <layout> [zstd|local]  every rank saves its part of
//                                      testing::sharded_state (zstd: items compressed,
//                                      Compression::kZstd; local: without collectives)
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
//   mpi_tool every-rank <dir>          a failure injected on one rank at each step of save, load
//                                      and async_save: every rank gets the error, naming the
//                                      step and the rank, within the case's time bound, and the
//                                      previous checkpoint stays whole
//   mpi_tool read-once <dir>           a replicated state loads bitwise with read-once
//                                      broadcasts and without; with them the ranks read each
//                                      record once between them
//   mpi_tool collectives <dir>         MpiCommunicator's collectives from and to every root,
//                                      with empty, small and multi-MiB pieces (dir unused)
// Layouts: row, column, mesh2d. Exit code 0 only when every rank succeeded.
#include <mpi.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>

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

void save_state(dcp::Communicator& comm, const std::string& dir, Layout layout,
                const std::string& mode = "") {
  dcp::StateDict sd = dcp::testing::sharded_state(comm.rank(), comm.size(), layout, false);
  dcp::SaveOptions options;
  options.comm = &comm;
  options.use_collectives = mode != "local";
  dcp::FileSystemWriterOptions writer_options;
  if (mode == "zstd") writer_options.compression = dcp::Compression::kZstd;
  dcp::FileSystemWriter writer(dir, writer_options);
  dcp::save(sd, writer, options);
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

// ---------------------------------------------------------------------------------------------
// Every rank returns (issue #13): one rank fails at one step; every rank must raise an error
// that names the step and that rank, well within the deadline given to the collectives (so a
// rank left waiting would fail the bound rather than hang), and a failed save must leave the
// previous checkpoint whole.

enum class Step {
  kNone,
  kSetUp,       // planner.set_up_planner (every rank)
  kLocalPlan,   // planner.create_local_plan
  kGlobalPlan,  // planner.create_global_plan (coordinator)
  kFinishPlan,  // planner.finish_plan
  kResolve,     // save: planner.resolve_data, while writing
  kCommit,      // load: planner.commit_tensor, while reading
};

[[noreturn]] void injected(const char* where) { TORCH_CHECK(false, "injected fault in ", where); }

class FaultySavePlanner : public dcp::DefaultSavePlanner {
 public:
  explicit FaultySavePlanner(Step step) : step_(step) {}
  void set_up_planner(const dcp::StateDict& state, const std::optional<dcp::StorageMeta>& meta,
                      bool is_coordinator) override {
    if (step_ == Step::kSetUp) injected("set_up_planner");
    DefaultSavePlanner::set_up_planner(state, meta, is_coordinator);
  }
  dcp::SavePlan create_local_plan() override {
    if (step_ == Step::kLocalPlan) injected("create_local_plan");
    return DefaultSavePlanner::create_local_plan();
  }
  std::pair<std::vector<dcp::SavePlan>, dcp::Metadata> create_global_plan(
      std::vector<dcp::SavePlan> plans) override {
    if (step_ == Step::kGlobalPlan) injected("create_global_plan");
    return DefaultSavePlanner::create_global_plan(std::move(plans));
  }
  dcp::SavePlan finish_plan(dcp::SavePlan plan) override {
    if (step_ == Step::kFinishPlan) injected("finish_plan");
    return DefaultSavePlanner::finish_plan(std::move(plan));
  }
  dcp::WritePayload resolve_data(const dcp::WriteItem& item) override {
    if (step_ == Step::kResolve) injected("resolve_data");
    return DefaultSavePlanner::resolve_data(item);
  }

 private:
  Step step_;
};

class FaultyLoadPlanner : public dcp::DefaultLoadPlanner {
 public:
  explicit FaultyLoadPlanner(Step step) : step_(step) {}
  void set_up_planner(dcp::StateDict& state, const dcp::Metadata& metadata,
                      bool is_coordinator) override {
    if (step_ == Step::kSetUp) injected("set_up_planner");
    DefaultLoadPlanner::set_up_planner(state, metadata, is_coordinator);
  }
  dcp::LoadPlan create_local_plan() override {
    if (step_ == Step::kLocalPlan) injected("create_local_plan");
    return DefaultLoadPlanner::create_local_plan();
  }
  std::vector<dcp::LoadPlan> create_global_plan(std::vector<dcp::LoadPlan> plans) override {
    if (step_ == Step::kGlobalPlan) injected("create_global_plan");
    return DefaultLoadPlanner::create_global_plan(std::move(plans));
  }
  dcp::LoadPlan finish_plan(dcp::LoadPlan plan) override {
    if (step_ == Step::kFinishPlan) injected("finish_plan");
    return DefaultLoadPlanner::finish_plan(std::move(plan));
  }
  void commit_tensor(const dcp::ReadItem& item, const at::Tensor& tensor) override {
    if (step_ == Step::kCommit) injected("commit_tensor");
    DefaultLoadPlanner::commit_tensor(item, tensor);
  }

 private:
  Step step_;
};

// A reader whose read_metadata (coordinator) or read_data fails.
class FaultyReader : public dcp::StorageReaderWrapper {
 public:
  FaultyReader(const std::string& dir, bool metadata, bool data)
      : StorageReaderWrapper(std::make_shared<dcp::FileSystemReader>(dir)),
        metadata_(metadata),
        data_(data) {}
  dcp::Metadata read_metadata() override {
    if (metadata_) injected("read_metadata");
    return StorageReaderWrapper::read_metadata();
  }
  std::future<void> read_data(const dcp::LoadPlan& plan, dcp::LoadPlanner& planner) override {
    if (data_) injected("read_data");
    return StorageReaderWrapper::read_data(plan, planner);
  }

 private:
  bool metadata_, data_;
};

struct Case {
  const char* name;
  int bad;                // the failing rank (-1: the last one)
  const char* step;       // the step every rank's error must name
  std::function<void(dcp::Communicator&, const std::string& dir, bool bad)> run;
};

void every_rank_case(dcp::Communicator& comm, const std::string& dir) {
  using dcp::testing::FaultPoint;
  const std::chrono::seconds deadline(60);  // on the collectives: a stuck rank fails, not hangs
  const std::string good = dir + "/good";
  save_state(comm, good, Layout::kRow);
  auto save_options = [&](Step step, bool bad) {
    dcp::SaveOptions o;
    o.comm = &comm;
    o.timeout = deadline;
    o.planner = std::make_shared<FaultySavePlanner>(bad ? step : Step::kNone);
    return o;
  };
  auto saving = [&](Step step) {
    return [=](dcp::Communicator& c, const std::string& d, bool bad) {
      dcp::StateDict sd = dcp::testing::sharded_state(c.rank(), c.size(), Layout::kRow, false);
      dcp::save(sd, d, save_options(step, bad));
    };
  };
  auto writer_fault = [&](FaultPoint point) {
    return [=](dcp::Communicator& c, const std::string& d, bool bad) {
      dcp::StateDict sd = dcp::testing::sharded_state(c.rank(), c.size(), Layout::kRow, false);
      dcp::testing::FaultInjectionWriter writer(std::make_shared<dcp::FileSystemWriter>(d),
                                                bad ? point : FaultPoint::kNone);
      dcp::save(sd, writer, save_options(Step::kNone, false));
    };
  };
  auto loading = [&](Step step, bool metadata, bool data) {
    return [=](dcp::Communicator& c, const std::string&, bool bad) {
      dcp::StateDict sd = dcp::testing::sharded_state(c.rank(), c.size(), Layout::kColumn, true);
      FaultyReader reader(good, bad && metadata, bad && data);
      dcp::LoadOptions o;
      o.comm = &c;
      o.timeout = deadline;
      o.planner = std::make_shared<FaultyLoadPlanner>(bad ? step : Step::kNone);
      dcp::load(sd, reader, o);
    };
  };
  auto async_saving = [&](Step step, FaultPoint point, bool undefined_tensor) {
    return [=](dcp::Communicator& c, const std::string& d, bool bad) {
      dcp::StateDict sd = dcp::testing::sharded_state(c.rank(), c.size(), Layout::kRow, false);
      if (bad && undefined_tensor) sd["broken"] = at::Tensor();  // staging fails here only
      dcp::AsyncSaveOptions o;
      static_cast<dcp::SaveOptions&>(o) = save_options(step, bad);
      auto writer = std::make_shared<dcp::testing::FaultInjectionWriter>(
          std::make_shared<dcp::FileSystemWriter>(d), bad ? point : FaultPoint::kNone);
      dcp::async_save(sd, writer, o).get();
    };
  };
  const int last = comm.size() - 1;
  const std::vector<Case> cases = {
      {"save: set_up_planner", last, "plan", saving(Step::kSetUp)},
      {"save: create_local_plan", last, "plan", saving(Step::kLocalPlan)},
      {"save: create_global_plan", 0, "plan", saving(Step::kGlobalPlan)},
      {"save: finish_plan", last, "write", saving(Step::kFinishPlan)},
      {"save: resolve_data", last, "write", saving(Step::kResolve)},
      {"save: write_data", last, "write", writer_fault(FaultPoint::kWriteData)},
      {"save: commit", 0, "write", writer_fault(FaultPoint::kFinish)},
      {"load: read_metadata", 0, "read metadata", loading(Step::kNone, true, false)},
      {"load: set_up_planner", last, "plan", loading(Step::kSetUp, false, false)},
      {"load: create_local_plan", last, "plan", loading(Step::kLocalPlan, false, false)},
      {"load: create_global_plan", 0, "plan", loading(Step::kGlobalPlan, false, false)},
      // The state holds a replicated tensor, so finish_plan runs in the step that prepares the
      // read-once broadcasts (Note [Read once, broadcast]).
      {"load: finish_plan", last, "prepare reads", loading(Step::kFinishPlan, false, false)},
      {"load: read_data", last, "read", loading(Step::kNone, false, true)},
      {"load: commit_tensor", last, "read", loading(Step::kCommit, false, false)},
      // A staging failure travels in the plan step (Note [Failed staging]).
      {"async_save: staging", last, "plan", async_saving(Step::kNone, FaultPoint::kNone, true)},
      {"async_save: create_local_plan", last, "plan",
       async_saving(Step::kLocalPlan, FaultPoint::kNone, false)},
      {"async_save: create_global_plan", 0, "plan",
       async_saving(Step::kGlobalPlan, FaultPoint::kNone, false)},
      {"async_save: write_data", last, "write",
       async_saving(Step::kNone, FaultPoint::kWriteData, false)},
      {"async_save: commit", 0, "write", async_saving(Step::kNone, FaultPoint::kFinish, false)},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const std::string target = dir + "/case" + std::to_string(k);
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { c.run(comm, target, comm.rank() == c.bad); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string expected_rank = "failed on rank " + std::to_string(c.bad) + " of ";
    TORCH_CHECK(!msg.empty(), c.name, ": rank ", comm.rank(), " got no error");
    TORCH_CHECK(msg.find(expected_rank) != std::string::npos, c.name, ": rank ", comm.rank(),
                " does not name rank ", c.bad, ": '", msg, "'");
    TORCH_CHECK(msg.find("step '" + std::string(c.step)) != std::string::npos, c.name,
                ": rank ", comm.rank(), " does not name step '", c.step, "': '", msg, "'");
    TORCH_CHECK(msg.find("injected fault") != std::string::npos ||
                    msg.find("undefined") != std::string::npos,
                c.name, ": rank ", comm.rank(), " lost the cause: '", msg, "'");
    TORCH_CHECK(seconds < 30, c.name, ": rank ", comm.rank(), " took ", seconds, " s");
    TORCH_CHECK(!std::filesystem::exists(target + "/.metadata"), c.name,
                ": a failed save left .metadata");
    comm.barrier();
    if (comm.rank() == 0) std::cout << "  every rank failed cleanly: " << c.name << "\n";
  }
  load_and_check(comm, good, Layout::kMesh2d);  // untouched by all of it
}

// Read once, broadcast under mpirun: a replicated state (large boxes broadcast straight, small
// ones packed) loads bitwise with LoadOptions::read_once on and off; with it, the ranks read the
// checkpoint's tensor records once between them, without it every rank reads them all.
void read_once_case(dcp::Communicator& comm, const std::string& dir) {
  auto state = [&](bool zeros) {
    dcp::StateDict sd;
    auto t = [&](c10::ScalarType dtype, std::vector<int64_t> shape, int64_t seed) {
      at::Tensor v = dcp::testing::make_tensor(dtype, shape, seed);
      return zeros ? at::zeros_like(v) : v;
    };
    sd["big"] = t(at::kFloat, {512, 1024}, 1);
    sd["big_bf16"] = t(at::kBFloat16, {1024, 1024}, 2);
    for (int i = 0; i < 30; ++i) sd["small." + std::to_string(i)] = t(at::kFloat, {8, 8 + i}, 10 + i);
    return sd;
  };
  dcp::SaveOptions save_options;
  save_options.comm = &comm;
  dcp::save(state(false), dir, save_options);
  int64_t read[2] = {0, 0};  // this rank's bytes read: with read_once, without
  for (int once = 1; once >= 0; --once) {
    dcp::StateDict sd = state(true);
    dcp::LoadOptions options;
    options.comm = &comm;
    options.read_once = once == 1;
    options.on_event = [&](const dcp::Event& e) {
      if (e.phase == dcp::Phase::kRead && e.end) read[once] = e.bytes;
    };
    dcp::load(sd, dir, options);
    const std::string diff = dcp::testing::describe_difference(dcp::Value(state(false)), dcp::Value(sd));
    TORCH_CHECK(diff.empty(), "rank ", comm.rank(), " read_once=", once, ": ", diff);
  }
  int64_t total[2] = {0, 0};
  MPI_Allreduce(read, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  const int64_t tensor_bytes = (512 * 1024 + 1024 * 1024 / 2) * 4;  // at least the large records
  TORCH_CHECK(total[1] >= tensor_bytes && total[1] < tensor_bytes * 11 / 10,
              "with read_once the ranks read ", total[1], " bytes, not about ", tensor_bytes);
  TORCH_CHECK(total[0] >= tensor_bytes * comm.size(), "without read_once the ranks read ",
              total[0], " bytes, not every record each");
}

// MpiCommunicator's collectives deliver what they promise, from and to every root, with the
// deadlines' polling on: pieces empty, of a few bytes and of several MiB, different for every
// pair of ranks. A scatter sends each rank its piece point-to-point from the root's buffers;
// back-to-back scatters from one root must not mix.
void collectives_case(dcp::Communicator& comm, const std::string& /*dir*/) {
  comm.set_timeout(std::chrono::seconds(60));
  const int n = comm.size(), me = comm.rank();
  auto piece = [](int from, int to, int round = 0) {
    const int kind = (from + to + round) % 3;
    const size_t size = kind == 0 ? 0 : kind == 1 ? 5 : (size_t{3} << 20) + from;
    std::string s(size, '\0');
    for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>(from * 31 + to * 7 + round + i);
    return s;
  };
  for (int root = 0; root < n; ++root) {
    TORCH_CHECK(comm.broadcast(me == root ? piece(root, 1) : "", root) == piece(root, 1),
                "broadcast from ", root);
    const std::vector<std::string> all = comm.gather(piece(me, root), root);
    TORCH_CHECK(all.size() == (me == root ? static_cast<size_t>(n) : 0), "gather to ", root);
    for (int k = 0; k < static_cast<int>(all.size()); ++k) {
      TORCH_CHECK(all[k] == piece(k, root), "gather to ", root, ": rank ", k, "'s piece");
    }
    for (int round = 0; round < 2; ++round) {
      std::vector<std::string> parts;
      for (int k = 0; me == root && k < n; ++k) parts.push_back(piece(root, k, round));
      TORCH_CHECK(comm.scatter(parts, root) == piece(root, me, round), "scatter ", round,
                  " from ", root);
    }
    const std::string expected = piece(root, 2);
    std::string buffer = me == root ? expected : std::string(expected.size(), '\0');
    comm.broadcast_buffer(buffer.data(), buffer.size(), root);
    TORCH_CHECK(buffer == expected, "broadcast_buffer from ", root);
  }
  const std::vector<std::string> everyone = comm.all_gather(piece(me, 0));
  TORCH_CHECK(everyone.size() == static_cast<size_t>(n), "all_gather");
  for (int k = 0; k < n; ++k) TORCH_CHECK(everyone[k] == piece(k, 0), "all_gather: rank ", k);
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
      if (command == "save") save_state(comm, dir, layout, argc > 4 ? argv[4] : "");
      else if (command == "load") load_and_check(comm, dir, layout);
      else if (command == "fail") fail_case(comm, dir);
      else if (command == "nonshared") nonshared_case(comm, dir);
      else if (command == "timeout") timeout_case(comm, dir);
      else if (command == "user-comm") user_comm_case(comm, dir);
      else if (command == "async") async_case(comm, dir);
      else if (command == "every-rank") every_rank_case(comm, dir);
      else if (command == "read-once") read_once_case(comm, dir);
      else if (command == "collectives") collectives_case(comm, dir);
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
