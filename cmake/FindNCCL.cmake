# Finds NCCL (NVIDIA's collectives library) for LATHER_ENABLE_NCCL: the imported target NCCL::NCCL,
# NCCL_INCLUDE_DIR, NCCL_LIBRARY and NCCL_VERSION (from nccl.h). Looked for under NCCL_ROOT (the
# variable or the environment variable) first, then in the CUDA toolkit's directories (where the
# NVIDIA packages and pip's nvidia-nccl wheels copied into a toolkit put it), then the system's.
# Used at build time and again by the installed LatherConfig.cmake of a static liblather.

find_package(CUDAToolkit QUIET)
set(_nccl_hints)
if(CUDAToolkit_FOUND)
  list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT})
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part IN ITEMS MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" _nccl_${_part} "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  # nccl.h includes cuda_runtime.h; NCCL's own calls take cudaStream_t.
  if(TARGET CUDA::cudart)
    set_target_properties(NCCL::NCCL PROPERTIES INTERFACE_LINK_LIBRARIES CUDA::cudart)
  endif()
endif()
unset(_nccl_hints)
