# Finds Zstandard (dcp reads and writes Python DCP's "stream.zstd" items with it): Zstd_FOUND,
# Zstd_INCLUDE_DIR, Zstd_LIBRARY and the imported target Zstd::Zstd. Debian: libzstd-dev.
find_path(Zstd_INCLUDE_DIR zstd.h HINTS ${Zstd_ROOT} $ENV{Zstd_ROOT} PATH_SUFFIXES include)
find_library(Zstd_LIBRARY zstd HINTS ${Zstd_ROOT} $ENV{Zstd_ROOT} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Zstd DEFAULT_MSG Zstd_INCLUDE_DIR Zstd_LIBRARY)
if(Zstd_FOUND AND NOT TARGET Zstd::Zstd)
  add_library(Zstd::Zstd UNKNOWN IMPORTED)
  set_target_properties(Zstd::Zstd PROPERTIES
    IMPORTED_LOCATION "${Zstd_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${Zstd_INCLUDE_DIR}")
endif()
