// MpiCommunicator (see dcp/mpi_communicator.h). Variable-size buffers travel as a size
// exchange (MPI_INT64_T) followed by their bytes (MPI_BYTE): a broadcast, or point-to-point
// messages for gather and scatter. Every MPI return code passes through DCP_MPI_CHECK, the one
// place MPI errors are translated.
#include "dcp/mpi_communicator.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#include "util/wire.h"

#define DCP_MPI_CHECK(call)                                                       \
  do {                                                                            \
    const int dcp_mpi_rc = (call);                                                \
    if (dcp_mpi_rc != MPI_SUCCESS) ::dcp::detail::throw_mpi_error(#call, dcp_mpi_rc); \
  } while (0)

namespace dcp {
namespace detail {

[[noreturn]] void throw_mpi_error(const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  TORCH_CHECK(false, "MPI call ", call, " failed: ", std::string(text, len), " (code ", rc, ")");
}

}  // namespace detail

namespace {

int to_int_count(size_t n) {
  TORCH_CHECK(n <= static_cast<size_t>(INT_MAX), "MPI message of ", n,
              " bytes is larger than MPI's int count");
  return static_cast<int>(n);
}

// "1, 3": the ranks of the requests not done (ranks[i] is request i's peer).
std::string pending_ranks(const std::vector<int>& ranks, const std::vector<bool>& done) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!done[i]) out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// The point-to-point messages' tags, one per kind, so that no message of one collective can
// match a receive of another (messages of one kind match in order: MPI does not overtake).
constexpr int kGatherSizeTag = 1, kGatherDataTag = 2, kScatterDataTag = 3;

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  int initialized = 0;
  DCP_MPI_CHECK(MPI_Initialized(&initialized));
  TORCH_CHECK(initialized, "MpiCommunicator: MPI is not initialized (call MPI_Init first)");
  DCP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  DCP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DCP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DCP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    LOG(WARNING) << "MpiCommunicator destroyed after MPI_Finalize; its communicator leaks";
    return;
  }
  if (MPI_Comm_free(&comm_) != MPI_SUCCESS) {
    LOG(WARNING) << "MpiCommunicator: MPI_Comm_free failed";
  }
}

// Note [Collective deadlines]: with a timeout, every collective is a nonblocking MPI call
// (MPI_Ibcast, MPI_Isend, ...) polled with MPI_Testall until its deadline. A collective
// moves a large payload only while its ranks poll (the shared-memory transport copies it in
// fragments of tens of KiB, each side taking its turn), so each collective has two phases:
//   - arrival: a small message that completes only once the other side has reached the
//     collective (the size of what follows; in a gather a synchronous send, MPI_Issend). It is
//     polled with a backoff from 50 us to 5 ms, so a rank that waits seconds for a slow
//     coordinator leaves the cores to it;
//   - the payload: polled without pausing, since every rank is known to be there. With the
//     pauses, a 1 GiB broadcast over 8 ranks took 40x longer, and the 12 MiB metadata of
//     80,000 items took 0.7 s to reach 4 ranks instead of a few ms.
// A gather is point-to-point (each rank sends its size and bytes to the root, which posts one
// receive per rank), so that the root knows whose contribution never came; all_gather is a
// gather and a broadcast. A rank waiting on the root can only name the root. MPI cannot cancel
// a collective, so after a timeout this communicator is abandoned; the job's other ranks are
// reported, not recovered.
void MpiCommunicator::wait(std::vector<MPI_Request>& requests, const char* what,
                           const std::function<std::string(const std::vector<bool>&)>& missing,
                           bool spin) {
  if (requests.empty()) return;
  if (timeout_.count() <= 0) {
    DCP_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                              MPI_STATUSES_IGNORE));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(50);
  while (true) {
    int all_done = 0;
    DCP_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &all_done,
                              MPI_STATUSES_IGNORE));
    if (all_done) return;
    if (std::chrono::steady_clock::now() - start > timeout_) break;
    if (spin) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  std::vector<bool> done(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    int flag = 0;
    DCP_MPI_CHECK(MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE));
    done[i] = flag != 0;
  }
  TORCH_CHECK(false, "rank ", rank_, ": ", what, " timed out after ",
              std::chrono::duration<double>(timeout_).count(), " s: ", missing(done),
              " (a rank died, hangs, or skipped this collective)");
}

void MpiCommunicator::barrier() {
  std::vector<MPI_Request> r(1);
  DCP_MPI_CHECK(MPI_Ibarrier(comm_, &r[0]));
  wait(r, "barrier", [](const std::vector<bool>&) { return "some rank did not arrive"; });
}

std::string MpiCommunicator::broadcast(const std::string& data, int root) {
  auto from_root = [&](const std::vector<bool>&) {
    return c10::str("waiting for rank ", root, " (the root) or the ranks relaying from it");
  };
  int64_t n = rank_ == root ? static_cast<int64_t>(data.size()) : 0;
  std::vector<MPI_Request> r(1);
  DCP_MPI_CHECK(MPI_Ibcast(&n, 1, MPI_INT64_T, root, comm_, &r[0]));
  wait(r, "broadcast", from_root);
  std::string out = rank_ == root ? data : std::string(static_cast<size_t>(n), '\0');
  // In pieces, like any buffer: the Metadata of a large job can pass MPI's int count.
  if (n > 0) broadcast_buffer(out.data(), static_cast<size_t>(n), root);
  return out;
}

void MpiCommunicator::broadcast_buffer(void* data, size_t nbytes, int root) {
  constexpr size_t kPiece = size_t{1} << 30;
  auto from_root = [&](const std::vector<bool>&) {
    return c10::str("waiting for rank ", root, " (the root) or the ranks relaying from it");
  };
  std::vector<MPI_Request> r(1);
  for (size_t done = 0; done < nbytes; done += kPiece) {
    const size_t n = std::min(kPiece, nbytes - done);
    DCP_MPI_CHECK(MPI_Ibcast(static_cast<char*>(data) + done, to_int_count(n), MPI_BYTE, root,
                             comm_, &r[0]));
    wait(r, "broadcast", from_root, /*spin=*/true);
  }
}

std::vector<std::string> MpiCommunicator::gather(const std::string& data, int root) {
  if (rank_ != root) {
    const int64_t n = static_cast<int64_t>(data.size());
    auto never_taken = [&](const std::vector<bool>&) {
      return c10::str("rank ", root, " (the root) never took this rank's contribution");
    };
    std::vector<MPI_Request> r(1);
    // Synchronous: complete once the root has matched it, that is, reached the gather.
    DCP_MPI_CHECK(MPI_Issend(&n, 1, MPI_INT64_T, root, kGatherSizeTag, comm_, &r[0]));
    wait(r, "gather", never_taken);
    if (n > 0) {
      DCP_MPI_CHECK(MPI_Isend(data.data(), to_int_count(data.size()), MPI_BYTE, root,
                              kGatherDataTag, comm_, &r[0]));
      wait(r, "gather", never_taken, /*spin=*/true);
    }
    return {};
  }
  std::vector<std::string> out(size_);
  std::vector<int64_t> sizes(size_, 0);
  std::vector<MPI_Request> r;
  std::vector<int> peers;  // the rank of each request in r
  for (int k = 0; k < size_; ++k) {
    if (k == rank_) continue;
    r.emplace_back();
    peers.push_back(k);
    DCP_MPI_CHECK(MPI_Irecv(&sizes[k], 1, MPI_INT64_T, k, kGatherSizeTag, comm_, &r.back()));
  }
  wait(r, "gather", [&](const std::vector<bool>& done) {
    return "rank(s) " + pending_ranks(peers, done) + " never arrived";
  });
  r.clear();
  peers.clear();
  for (int k = 0; k < size_; ++k) {
    if (k == rank_) continue;
    TORCH_CHECK(sizes[k] >= 0, "gather: rank ", k, " sent a negative size");
    out[k].resize(static_cast<size_t>(sizes[k]));
    if (sizes[k] == 0) continue;
    r.emplace_back();
    peers.push_back(k);
    DCP_MPI_CHECK(MPI_Irecv(out[k].data(), to_int_count(out[k].size()), MPI_BYTE, k,
                            kGatherDataTag, comm_, &r.back()));
  }
  wait(r, "gather", [&](const std::vector<bool>& done) {
    return "rank(s) " + pending_ranks(peers, done) + " sent their size but never their bytes";
  }, /*spin=*/true);
  out[rank_] = data;
  return out;
}

// Sizes through MPI_Iscatter (the arrival phase), then each rank's bytes point-to-point, sent
// from the root's buffers where they are: MPI_Scatterv would need them in one buffer, a copy
// of every rank's final plan (hundreds of MiB at scale) into fresh memory, and displacements
// that limit the total to 2 GiB.
std::string MpiCommunicator::scatter(const std::vector<std::string>& data, int root) {
  std::vector<int> counts;
  if (rank_ == root) {
    TORCH_CHECK(static_cast<int>(data.size()) == size_, "scatter: root passed ", data.size(),
                " buffers for ", size_, " ranks");
    for (const auto& d : data) counts.push_back(to_int_count(d.size()));
  }
  auto from_root = [&](const std::vector<bool>&) {
    return c10::str("waiting for rank ", root, " (the root)");
  };
  int n = 0;
  std::vector<MPI_Request> r(1);
  DCP_MPI_CHECK(MPI_Iscatter(counts.data(), 1, MPI_INT, &n, 1, MPI_INT, root, comm_, &r[0]));
  wait(r, "scatter", from_root);
  if (rank_ != root) {
    std::string out(static_cast<size_t>(n), '\0');
    if (n == 0) return out;
    DCP_MPI_CHECK(MPI_Irecv(out.data(), n, MPI_BYTE, root, kScatterDataTag, comm_, &r[0]));
    wait(r, "scatter", from_root, /*spin=*/true);
    return out;
  }
  r.clear();
  std::vector<int> peers;  // the rank of each send in r
  for (int k = 0; k < size_; ++k) {
    if (k == root || counts[k] == 0) continue;
    r.emplace_back();
    peers.push_back(k);
    DCP_MPI_CHECK(
        MPI_Isend(data[k].data(), counts[k], MPI_BYTE, k, kScatterDataTag, comm_, &r.back()));
  }
  wait(r, "scatter", [&](const std::vector<bool>& done) {
    return "rank(s) " + pending_ranks(peers, done) + " never took their part";
  }, /*spin=*/true);
  return data[root];
}

std::vector<std::string> MpiCommunicator::all_gather(const std::string& data) {
  constexpr int kRoot = 0;
  std::vector<std::string> all = gather(data, kRoot);  // the root names missing ranks
  detail::wire::Writer w;
  if (rank_ == kRoot) w.strs(all);
  const std::string packed = broadcast(w.take(), kRoot);
  detail::wire::Reader reader(packed);  // borrows `packed`
  return reader.strs();
}

std::unique_ptr<Communicator> MpiCommunicator::duplicate() {
  int level = MPI_THREAD_SINGLE;
  DCP_MPI_CHECK(MPI_Query_thread(&level));
  TORCH_CHECK(level == MPI_THREAD_MULTIPLE,
              "a background communicator needs MPI initialized with MPI_THREAD_MULTIPLE "
              "(MPI_Init_thread); this process has thread level ", level);
  return std::make_unique<MpiCommunicator>(comm_);
}

}  // namespace dcp
