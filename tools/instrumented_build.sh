# Sourced by tools/asan.sh and tools/tsan_async.sh: configures a sanitizer build of the
# library and its tests beside the main one.
#
#   configure_instrumented <dir> <torch_cmake_prefix> <sanitizer flags> [cmake args...]
configure_instrumented() {
  local dir="$1" prefix="$2" flags="$3"
  shift 3
  [[ -f "$dir/build.ninja" ]] && return 0
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$prefix" -DDCP_WITH_NCCL=OFF \
    -DDCP_BUILD_EXAMPLES=OFF -DDCP_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" "$@" >/dev/null
}
