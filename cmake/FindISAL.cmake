# Finds ISA-L, Intel's storage acceleration library (dcp uses its CRC-32): ISAL_FOUND,
# ISAL_INCLUDE_DIR, ISAL_LIBRARY and the imported target ISAL::isal. Debian: libisal-dev.
find_path(ISAL_INCLUDE_DIR isa-l/crc.h HINTS ${ISAL_ROOT} $ENV{ISAL_ROOT} PATH_SUFFIXES include)
find_library(ISAL_LIBRARY isal HINTS ${ISAL_ROOT} $ENV{ISAL_ROOT} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ISAL DEFAULT_MSG ISAL_INCLUDE_DIR ISAL_LIBRARY)
if(ISAL_FOUND AND NOT TARGET ISAL::isal)
  add_library(ISAL::isal UNKNOWN IMPORTED)
  set_target_properties(ISAL::isal PROPERTIES
    IMPORTED_LOCATION "${ISAL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${ISAL_INCLUDE_DIR}")
endif()
