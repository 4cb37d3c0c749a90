#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer runs and the fuzzers, in one clang build
# (<build_dir>/asan: the library, unit tests, mpi_tool and the libFuzzer targets, compiled with
# -fsanitize=address,undefined and libFuzzer's coverage). ctest runs each step (label 'asan');
# each exits 0 only when no sanitizer reported anything. LibTorch itself is not instrumented.
# Leak checking is off: LibTorch's static registries are reported as leaks at exit.
#
#   tools/asan.sh build <build_dir> <torch_cmake_prefix>   configure and build (ctest asan_build)
#   tools/asan.sh unit  <build_dir>      the unit tests (ctest asan_unit)
#   tools/asan.sh mpi   <build_dir>      the mpirun tests (ctest asan_mpi)
#   tools/asan.sh fuzz  <build_dir> <target> <seconds> [libFuzzer flags...]
#        runs tests/fuzz/<target> from a copy of its seed corpus (ctest fuzz_*); the executions
#        it made are appended to <build_dir>/asan/fuzz_stats.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { sed -n '8,13p' "${BASH_SOURCE[0]}" >&2; exit 2; }
STEP="${1:-}"
BUILD="${2:?$(usage)}/asan"
SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
export ASAN_OPTIONS="detect_leaks=0 abort_on_error=0 exitcode=67"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 exitcode=68"
export OMP_NUM_THREADS=1

case "$STEP" in
  build)
    PREFIX="${3:?$(usage)}"
    source "$ROOT/tools/instrumented_build.sh"
    configure_instrumented "$BUILD" "$PREFIX" "$SANITIZE -fsanitize=fuzzer-no-link" \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DDCP_WITH_MPI=ON -DDCP_BUILD_FUZZERS=ON \
      -DPython3_EXECUTABLE="$(command -v python3)"
    cmake --build "$BUILD" -j "$(nproc)"
    ;;
  unit)
    # The instrumented build's own ctest, unit label: the same binaries the main suite runs.
    ctest --test-dir "$BUILD" -L unit -LE "asan|tsan" --output-on-failure -j "$(nproc)"
    echo "AddressSanitizer and UndefinedBehaviorSanitizer: no reports (unit)"
    ;;
  mpi)
    # Every mpirun test of the suite (16 ranks included) against the instrumented mpi_tool.
    ctest --test-dir "$BUILD" -L mpi -LE "interop|example|consumer" --output-on-failure
    echo "AddressSanitizer and UndefinedBehaviorSanitizer: no reports (mpi)"
    ;;
  fuzz)
    TARGET="${3:?$(usage)}"
    SECONDS_="${4:?$(usage)}"
    shift 4
    SEEDS="$ROOT/tests/fuzz/corpus/${TARGET#fuzz_}"
    WORK="$BUILD/fuzz_work/$TARGET"
    rm -rf "$WORK" && mkdir -p "$WORK/corpus" "$WORK/crashes"
    cp "$SEEDS"/* "$WORK/corpus/"
    # What fuzzing found before (tests/fuzz/regressions/<corpus>) is replayed as seeds too.
    REGRESSIONS="$ROOT/tests/fuzz/regressions/${TARGET#fuzz_}"
    if [[ -d "$REGRESSIONS" ]]; then cp "$REGRESSIONS"/* "$WORK/corpus/"; fi
    LOG="$WORK/log.txt"
    # -rss_limit_mb: the readers' memory bound (Note [Expansion budget]) is far below it, so a
    # finding there is a real one. -timeout: no single input may take seconds.
    status=0
    "$BUILD/tests/fuzz/$TARGET" "$WORK/corpus" -max_total_time="$SECONDS_" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$WORK/crashes/" "$@" \
      >"$LOG" 2>&1 || status=$?
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -1)"
    echo "$TARGET: ${runs:-0} executions in ${SECONDS_} s, exit $status"
    echo "$(date -u +%FT%TZ) $TARGET ${runs:-0} $status" >>"$BUILD/fuzz_stats.txt"
    if ((status != 0)); then
      tail -60 "$LOG"
      ls -l "$WORK/crashes"
      exit "$status"
    fi
    ;;
  *) usage ;;
esac
