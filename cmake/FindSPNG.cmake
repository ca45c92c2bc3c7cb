# Finds libspng (spng.h, libspng; Debian's libspng-dev) without pkg-config. Defines SPNG::SPNG.
find_path(SPNG_INCLUDE_DIR spng.h)
find_library(SPNG_LIBRARY spng)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SPNG REQUIRED_VARS SPNG_INCLUDE_DIR SPNG_LIBRARY)
if(SPNG_FOUND AND NOT TARGET SPNG::SPNG)
  add_library(SPNG::SPNG UNKNOWN IMPORTED)
  set_target_properties(SPNG::SPNG PROPERTIES
    IMPORTED_LOCATION "${SPNG_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${SPNG_INCLUDE_DIR}")
endif()
