#!/usr/bin/env bash
# Builds the async-save, multi-rank and read-once tests with ThreadSanitizer in <build_dir>/tsan and runs
# them. ctest runs this (test 'tsan_async_save', label 'tsan'); exit 0 only when TSAN reports
# nothing. LibTorch itself is not instrumented; tools/tsan.supp lists what is suppressed there.
#
#   tools/tsan_async.sh <build_dir> <torch_cmake_prefix>
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:?usage: tsan_async.sh <build_dir> <torch_cmake_prefix>}/tsan"
PREFIX="${2:?usage: tsan_async.sh <build_dir> <torch_cmake_prefix>}"
source "$ROOT/tools/instrumented_build.sh"
# Four test binaries: the tests' precompiled header would cost more disk (0.7 GB) than time.
configure_instrumented "$BUILD" "$PREFIX" "-fsanitize=thread" -DDCP_WITH_MPI=OFF \
  -DDCP_PRECOMPILE_TEST_HEADERS=OFF
cmake --build "$BUILD" -j "$(nproc)" --target async_save_test async_exit_tool distributed_test shared_reads_test
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 suppressions=$ROOT/tools/tsan.supp"
export OMP_NUM_THREADS=1
"$BUILD/tests/async_save_test"
"$BUILD/tests/distributed_test"
"$BUILD/tests/shared_reads_test"
echo "ThreadSanitizer: no reports"
