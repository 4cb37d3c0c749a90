# Finds what dcp builds against: LibTorch (from the PyTorch wheel), fmt, Threads, MPI, NCCL.
#
# LibTorch: pass -DCMAKE_PREFIX_PATH=$(python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
# (tools/run.sh does this with the repo's venv).
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
# ISA-L's CRC-32 (the zip polynomial, PCLMUL-accelerated): checks tensor records on load.
find_package(ISAL REQUIRED)
find_package(Zstd REQUIRED)
# Header-only, private: the safetensors header parser (the CLI uses it too).
find_package(nlohmann_json CONFIG REQUIRED)

# fmt: LibTorch's include folder carries its own fmt headers (c10 includes them), so any
# '#include <fmt/...>' in a translation unit that sees LibTorch resolves there. Linking a
# second, system fmt library would mix two versions in one program. We therefore use exactly
# one fmt: LibTorch's, header-only. Only a LibTorch without fmt headers falls back to a
# packaged fmt.
set(_dcp_torch_fmt "")
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_dir}/fmt/format.h" AND NOT _dcp_torch_fmt)
    set(_dcp_torch_fmt "${_dir}")
  endif()
endforeach()
add_library(dcp_fmt INTERFACE)
if(_dcp_torch_fmt)
  message(STATUS "dcp: using LibTorch's fmt headers from ${_dcp_torch_fmt} (header-only)")
  target_compile_definitions(dcp_fmt INTERFACE FMT_HEADER_ONLY=1)
  target_include_directories(dcp_fmt SYSTEM INTERFACE "${_dcp_torch_fmt}")
else()
  find_package(fmt REQUIRED)
  target_link_libraries(dcp_fmt INTERFACE fmt::fmt)
endif()

if(DCP_WITH_MPI)
  find_package(MPI REQUIRED COMPONENTS CXX)
endif()

# NCCL: optional; needs NCCL's headers and library (NCCL_ROOT, CUDA_HOME, or the
# nvidia-nccl-cu13 wheel's nvidia/nccl folder) and the CUDA runtime.
if(DCP_WITH_NCCL)
  find_package(NCCL)
  find_package(CUDAToolkit QUIET)
  if(NOT NCCL_FOUND OR NOT CUDAToolkit_FOUND)
    message(STATUS "dcp: NCCL or CUDA headers not found; building without NCCL")
    set(DCP_WITH_NCCL OFF CACHE BOOL "" FORCE)
  else()
    message(STATUS "dcp: building the NCCL communicator (${NCCL_INCLUDE_DIR})")
  endif()
endif()

if(DCP_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
endif()

# Inside another project (add_subdirectory, FetchContent), the imported targets found here
# would be visible in this directory only, and the parent's targets that link dcp::dcp could
# not resolve torch or MPI::MPI_CXX: make them global.
if(NOT PROJECT_IS_TOP_LEVEL)
  get_directory_property(_dcp_imported IMPORTED_TARGETS)
  foreach(_target IN LISTS _dcp_imported)
    get_target_property(_global ${_target} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
