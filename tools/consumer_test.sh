#!/usr/bin/env bash
# Builds tests/consumer against dcp one of three ways and runs it under mpirun on 2 ranks
# (ctest consumer_package, consumer_subdirectory, consumer_fetchcontent):
#   package       `cmake --install <build_dir>` into a fresh prefix, then find_package(dcp)
#   subdirectory  add_subdirectory of this checkout
#   fetchcontent  FetchContent from this checkout's git repository at HEAD (committed state),
#                 as a shared library (BUILD_SHARED_LIBS=ON)
# The consumer is told where LibTorch is (CMAKE_PREFIX_PATH) and nothing else; it builds Release.
# A passing run removes its folder (each one holds a whole dcp build, up to 1 GiB); a failing one
# leaves it for a look.
#
#   tools/consumer_test.sh <mode> <build_dir> <torch_cmake_prefix>
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:?usage: consumer_test.sh package|subdirectory|fetchcontent <build_dir> <torch_prefix>}"
BUILD="${2:?usage}"
TORCH_PREFIX="${3:?usage}"
WORK="$BUILD/consumer/$MODE"
rm -rf "$WORK" && mkdir -p "$WORK"
source "$ROOT/tools/mpi_env.sh"

args=(-DCMAKE_BUILD_TYPE=Release -DDCP_CONSUMER_MODE="$MODE")
case "$MODE" in
  package)
    cmake --install "$BUILD" --prefix "$WORK/prefix" >/dev/null
    args+=(-DCMAKE_PREFIX_PATH="$WORK/prefix;$TORCH_PREFIX")
    # Nothing the package exports may name a path of this build.
    if grep -rn "$BUILD\|$ROOT/" "$WORK/prefix/lib/cmake/dcp/dcpTargets"*.cmake; then
      echo "the exported targets name paths of the build machine" >&2
      exit 1
    fi
    ;;
  subdirectory)
    args+=(-DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DDCP_SOURCE_DIR="$ROOT")
    ;;
  fetchcontent)
    args+=(-DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DDCP_GIT_REPOSITORY="file://$ROOT"
           -DDCP_GIT_TAG="$(git -C "$ROOT" rev-parse HEAD)" -DBUILD_SHARED_LIBS=ON)
    ;;
  *) echo "unknown mode $MODE" >&2; exit 2 ;;
esac
cmake -S "$ROOT/tests/consumer" -B "$WORK/build" -G Ninja "${args[@]}" >"$WORK/configure.log" ||
  { cat "$WORK/configure.log"; exit 1; }
# Inside another project, dcp must not add its tests, examples or benchmarks.
if [[ "$MODE" != package ]] && grep -q "dcp_testing\|fsdp_train\|dcp_bench" "$WORK/build/build.ninja"; then
  echo "dcp built its tests, examples or benchmarks inside the consumer" >&2
  exit 1
fi
cmake --build "$WORK/build" -j "$(nproc)"
if [[ "$MODE" == fetchcontent ]]; then
  # ldd's whole output first: with pipefail, `ldd | grep -q` fails when grep's early exit
  # kills ldd with SIGPIPE.
  libraries="$(ldd "$WORK/build/consumer")"
  if [[ "$libraries" != *libdcp.so* ]]; then
    echo "consumer not linked to libdcp.so:" >&2
    echo "$libraries" >&2
    exit 1
  fi
fi
"${MPIRUN[@]}" -np 2 "$WORK/build/consumer" "$WORK/ckpt"
rm -rf "$WORK"
