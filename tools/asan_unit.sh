#!/usr/bin/env bash
# Builds the unit tests with AddressSanitizer and UndefinedBehaviorSanitizer in
# <build_dir>/asan and runs them; exit 0 only when neither reports anything. ctest runs this
# (test 'asan_unit', label 'asan'). The reliability, pickle, codec and storage tests feed the
# readers hostile input, so this is where an out-of-bounds read or an overflow would show.
# LibTorch itself is not instrumented. Leak checking is off: LibTorch's static registries
# are reported as leaks at exit.
#
#   tools/asan_unit.sh <build_dir> <torch_cmake_prefix>
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:?usage: asan_unit.sh <build_dir> <torch_cmake_prefix>}/asan"
PREFIX="${2:?usage: asan_unit.sh <build_dir> <torch_cmake_prefix>}"
TESTS=(pickle_test metadata_codec_test planner_test read_schedule_test storage_test
       checkpoint_test distributed_test reliability_test state_dict_test)
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$PREFIX" -DDCP_WITH_MPI=OFF -DDCP_WITH_NCCL=OFF \
    -DDCP_BUILD_EXAMPLES=OFF -DDCP_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)" --target "${TESTS[@]}"
export ASAN_OPTIONS="detect_leaks=0 abort_on_error=0 exitcode=67"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 exitcode=68"
export OMP_NUM_THREADS=1
for t in "${TESTS[@]}"; do
  echo "== $t"
  "$BUILD/tests/$t" --gtest_brief=1
done
echo "AddressSanitizer and UndefinedBehaviorSanitizer: no reports"
