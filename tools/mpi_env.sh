# Sourced by the scripts that launch mpirun (tools/fsdp_demo.sh, bench/run_bench.sh): many ranks
# on few cores (one intra-op thread each, oversubscribed, unbound), possibly as root, over
# shared memory without the single-copy mechanism that containers often forbid. The ctest
# mpirun tests use the same settings (DCP_MPIRUN and DCP_MPI_ENV in tests/CMakeLists.txt).
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
