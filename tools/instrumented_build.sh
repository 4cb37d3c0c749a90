# Sourced by tools/asan.sh and tools/tsan_async.sh: configures a sanitizer build of the
# library and its tests beside the main one. Debug information is zlib-compressed (-gz), as in
# the main build (tools/run.sh); the symbolizers read it as before.
#
#   configure_instrumented <dir> <torch_cmake_prefix> <sanitizer flags> [cmake args...]
configure_instrumented() {
  local dir="$1" prefix="$2" flags="$3"
  shift 3
  [[ -f "$dir/build.ninja" ]] && return 0
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$prefix" -DDCP_WITH_NCCL=OFF \
    -DDCP_BUILD_EXAMPLES=OFF -DDCP_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer -gz" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags -gz" "$@" >/dev/null
}
