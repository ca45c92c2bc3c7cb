# Finds libwebp (webp/decode.h, libwebp; Debian's libwebp-dev) without pkg-config. Defines WebP::WebP.
find_path(WEBP_INCLUDE_DIR webp/decode.h)
find_library(WEBP_LIBRARY webp)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(WebP REQUIRED_VARS WEBP_INCLUDE_DIR WEBP_LIBRARY)
if(WebP_FOUND AND NOT TARGET WebP::WebP)
  add_library(WebP::WebP UNKNOWN IMPORTED)
  set_target_properties(WebP::WebP PROPERTIES
    IMPORTED_LOCATION "${WEBP_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${WEBP_INCLUDE_DIR}")
endif()
