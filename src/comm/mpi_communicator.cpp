// MpiCommunicator (see dcp/mpi_communicator.h). Variable-size buffers travel as a size
// exchange (MPI_INT64_T) followed by the matching v-collective over MPI_BYTE. Every MPI return
// code passes through DCP_MPI_CHECK, the one place MPI errors are translated.
#include "dcp/mpi_communicator.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <climits>
#include <cstdint>

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

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> displs(counts.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    TORCH_CHECK(total <= INT_MAX, "MPI v-collective larger than MPI's int displacement");
    displs[i] = static_cast<int>(total);
    total += counts[i];
  }
  TORCH_CHECK(total <= INT_MAX, "MPI v-collective larger than MPI's int displacement");
  return displs;
}

std::vector<std::string> split(const std::string& all, const std::vector<int>& counts,
                               const std::vector<int>& displs) {
  std::vector<std::string> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out[i] = all.substr(displs[i], counts[i]);
  return out;
}

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

void MpiCommunicator::barrier() { DCP_MPI_CHECK(MPI_Barrier(comm_)); }

std::string MpiCommunicator::broadcast(const std::string& data, int root) {
  int64_t n = rank_ == root ? static_cast<int64_t>(data.size()) : 0;
  DCP_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, comm_));
  std::string out = rank_ == root ? data : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) DCP_MPI_CHECK(MPI_Bcast(out.data(), to_int_count(n), MPI_BYTE, root, comm_));
  return out;
}

std::vector<std::string> MpiCommunicator::gather(const std::string& data, int root) {
  int n = to_int_count(data.size());
  std::vector<int> counts(rank_ == root ? size_ : 0);
  DCP_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm_));
  std::vector<int> displs;
  std::string all;
  if (rank_ == root) {
    displs = displacements(counts);
    all.resize(static_cast<size_t>(displs.back()) + counts.back());
  }
  DCP_MPI_CHECK(MPI_Gatherv(data.data(), n, MPI_BYTE, all.data(), counts.data(), displs.data(),
                            MPI_BYTE, root, comm_));
  if (rank_ != root) return {};
  return split(all, counts, displs);
}

std::string MpiCommunicator::scatter(const std::vector<std::string>& data, int root) {
  std::vector<int> counts;
  std::vector<int> displs;
  std::string all;
  if (rank_ == root) {
    TORCH_CHECK(static_cast<int>(data.size()) == size_, "scatter: root passed ", data.size(),
                " buffers for ", size_, " ranks");
    for (const auto& d : data) counts.push_back(to_int_count(d.size()));
    displs = displacements(counts);
    for (const auto& d : data) all += d;
  }
  int n = 0;
  DCP_MPI_CHECK(MPI_Scatter(counts.data(), 1, MPI_INT, &n, 1, MPI_INT, root, comm_));
  std::string out(static_cast<size_t>(n), '\0');
  DCP_MPI_CHECK(MPI_Scatterv(all.data(), counts.data(), displs.data(), MPI_BYTE, out.data(), n,
                             MPI_BYTE, root, comm_));
  return out;
}

std::vector<std::string> MpiCommunicator::all_gather(const std::string& data) {
  int n = to_int_count(data.size());
  std::vector<int> counts(size_);
  DCP_MPI_CHECK(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_));
  const std::vector<int> displs = displacements(counts);
  std::string all(static_cast<size_t>(displs.back()) + counts.back(), '\0');
  DCP_MPI_CHECK(MPI_Allgatherv(data.data(), n, MPI_BYTE, all.data(), counts.data(),
                               displs.data(), MPI_BYTE, comm_));
  return split(all, counts, displs);
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
