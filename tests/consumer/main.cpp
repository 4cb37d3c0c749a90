// The consumer project's program (tests/consumer): under mpirun, every rank saves its row
// shard of a sharded tensor and a plain tensor with dcp::save, loads them back into zeros with
// dcp::load, and checks them bit for bit. Exit 0 only when every rank did.
//
//   mpirun -np N consumer <checkpoint_dir>
#include <ATen/ATen.h>
#include <dcp/dcp.h>
#include <dcp/version.h>
#include <mpi.h>

#include <iostream>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0;
  {
    dcp::MpiCommunicator comm(MPI_COMM_WORLD);
    const int rank = comm.rank(), world = comm.size();
    try {
      TORCH_CHECK(argc == 2, "usage: consumer <checkpoint_dir>");
      const int64_t rows = 4;  // per rank
      auto make = [&](bool zeros) {
        at::Tensor mine = at::arange(rows * 3, at::kFloat).reshape({rows, 3}).add(rank * 100);
        if (zeros) mine.zero_();
        dcp::StateDict sd;
        sd["weight"] = dcp::ShardedTensor({rows * world, 3}, at::kFloat, {{mine, {rank * rows, 0}}});
        sd["bias"] = zeros ? at::zeros({5}, at::kDouble) : at::linspace(0, 1, 5, at::kDouble);
        return sd;
      };
      dcp::SaveOptions save_options;
      save_options.comm = &comm;
      dcp::save(make(false), argv[1], save_options);
      dcp::StateDict loaded = make(true);
      dcp::LoadOptions load_options;
      load_options.comm = &comm;
      dcp::load(loaded, argv[1], load_options);
      const dcp::StateDict expected = make(false);
      TORCH_CHECK(at::equal(loaded.at("bias").tensor(), expected.at("bias").tensor()), "bias differs");
      TORCH_CHECK(at::equal(loaded.at("weight").get<dcp::ShardedTensor>().local_shards()[0].tensor,
                            expected.at("weight").get<dcp::ShardedTensor>().local_shards()[0].tensor),
                  "weight shard differs");
    } catch (const c10::Error& e) {
      std::cerr << "rank " << rank << ": " << e.what_without_backtrace() << "\n";
      failed = 1;
    }
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      std::cout << (any ? "FAILED" : "OK") << ": dcp " << dcp::kVersion << " (" << DCP_VERSION_MAJOR
                << "." << DCP_VERSION_MINOR << "." << DCP_VERSION_PATCH << ") saved and loaded on "
                << world << " ranks\n";
    }
    failed = any;
  }
  MPI_Finalize();
  return failed;
}
