#!/usr/bin/env bash
# One entry point for a fresh machine: installs what is missing (Debian packages, the repo's
# Python venv with PyTorch 2.13.0), configures and builds, then runs the demo or the tests.
#
#   tools/run.sh demo    build, then run the main demo: train with FSDP-style sharding on 16
#                        ranks with checkpoints, resume on 4 and on 8 ranks, compare losses
#   tools/run.sh test    build, then run the whole test suite (unit, interop against Python DCP)
#   tools/run.sh build   set up and build only
#
# Idempotent: each step is skipped when already done. BUILD_DIR overrides the build folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
VENV="$ROOT/.venv"
TORCH_VERSION="2.13.0"
JOBS="${JOBS:-$(nproc)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

log() { printf '\n== %s\n' "$*"; }

# Debug information is kept (RelWithDebInfo) but zlib-compressed in objects and binaries (-gz):
# gdb and the sanitizers' symbolizers read it as before, and the main build takes a third less
# disk (3.3 GB to 2.1 GB).
GZ_FLAGS="-gz"
# What a fresh `test` run writes at its peak, with a margin: the 1.2 GiB venv, the build, the
# sanitizer builds, a consumer build and the tests' checkpoints (README "Quick start").
TEST_DISK_GIB=6

# Free space where the build lives, in KiB.
free_kib() { df -Pk "$ROOT" | awk 'NR == 2 {print $4}'; }
report_disk() { log "disk: $(($(free_kib) / 1048576)) GiB free under $ROOT ($1)"; }

install_packages() {
  local packages=(cmake ninja-build g++ python3-venv libopenmpi-dev openmpi-bin libisal-dev libgtest-dev
                  libgmock-dev clang-14 libcli11-dev nlohmann-json3-dev libzstd-dev)
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c "import torch, numpy, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    log "installing torch==$TORCH_VERSION into $VENV"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy
  fi
  # Python DCP's ZStandard extension needs zstandard; the safetensors tests need safetensors.
  if ! "$VENV/bin/python" -c "import zstandard, safetensors" 2>/dev/null; then
    log "installing zstandard and safetensors into $VENV"
    "$VENV/bin/pip" install -q zstandard safetensors
  fi
}

# The NCCL communicator is built when CUDA's headers are on the machine: NCCL itself comes
# from the nvidia-nccl-cu13 wheel in the venv. Without CUDA (or the wheel) it is left out.
nccl_flags() {
  local cuda="${CUDA_HOME:-/usr/local/cuda}"
  [[ -f "$cuda/include/cuda_runtime_api.h" ]] || return 0
  local nccl="$VENV/lib/python3.11/site-packages/nvidia/nccl"
  if [[ ! -f "$nccl/include/nccl.h" ]]; then
    "$VENV/bin/pip" install -q nvidia-nccl-cu13 >/dev/null 2>&1 || true
  fi
  nccl="$("$VENV/bin/python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  [[ -n "$nccl" && -f "$nccl/include/nccl.h" ]] || return 0
  echo "-DDCP_WITH_NCCL=ON -DNCCL_ROOT=$nccl -DCUDAToolkit_ROOT=$cuda"
}

build() {
  install_packages
  install_venv
  local prefix
  prefix="$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    log "configuring $BUILD_DIR"
    # shellcheck disable=SC2046
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_PREFIX_PATH="$prefix" -DPython3_EXECUTABLE="$VENV/bin/python" \
      -DCMAKE_CXX_FLAGS="${CXXFLAGS:-} $GZ_FLAGS" -DCMAKE_EXE_LINKER_FLAGS="${LDFLAGS:-} $GZ_FLAGS" \
      -DCMAKE_SHARED_LINKER_FLAGS="${LDFLAGS:-} $GZ_FLAGS" $(nccl_flags)
  fi
  log "building"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

case "${1:-}" in
  build)
    build
    ;;
  demo)
    build
    log "demo: examples/fsdp_train (save on 16 ranks, resume on 4 and 8)"
    "$ROOT/tools/fsdp_demo.sh" "$BUILD_DIR"
    ;;
  test)
    report_disk "before the build"
    if [[ ! -d "$BUILD_DIR" ]] && (($(free_kib) < TEST_DISK_GIB * 1048576)); then
      echo "warning: a fresh test run writes about $TEST_DISK_GIB GiB; with less free, builds and" \
        "tests fail with 'No space left on device'" >&2
    fi
    build
    log "tests"
    cd "$BUILD_DIR"
    status=0
    ctest --output-on-failure -j "$JOBS" --timeout 900 || status=$?
    report_disk "after the tests"
    exit "$status"
    ;;
  *)
    echo "usage: $0 demo|test|build" >&2
    exit 2
    ;;
esac
