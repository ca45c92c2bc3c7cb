# Finds libyuv (libyuv.h, libyuv) without pkg-config. Defines LibYUV::LibYUV.
find_path(LibYUV_INCLUDE_DIR libyuv.h)
find_library(LibYUV_LIBRARY yuv)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(LibYUV REQUIRED_VARS LibYUV_INCLUDE_DIR LibYUV_LIBRARY)
if(LibYUV_FOUND AND NOT TARGET LibYUV::LibYUV)
  add_library(LibYUV::LibYUV UNKNOWN IMPORTED)
  set_target_properties(LibYUV::LibYUV PROPERTIES
    IMPORTED_LOCATION "${LibYUV_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LibYUV_INCLUDE_DIR}")
endif()
