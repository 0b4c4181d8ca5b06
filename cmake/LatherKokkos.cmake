# Finds Kokkos and Kokkos Kernels and yields one interface target, Lather::kokkos.
#
# Two installations are supported:
#   * a standard Kokkos >= 4 install (CMake targets Kokkos::kokkos and Kokkos::kokkoskernels),
#     any backend;
#   * the Debian Trilinos packaging (Kokkos 3.4.01, Serial). Its imported Kokkos::kokkos target
#     names an include directory that does not exist, so we build the target from the TriBITS
#     variables KokkosKernels_INCLUDE_DIRS / _LIBRARIES / _TPL_LIBRARIES instead.
# Sets LATHER_KOKKOS_FLAVOR ("kokkos" or "tribits") and LATHER_KOKKOS_VERSION.
# Used at build time and again by the installed LatherConfig.cmake.

if(TARGET Lather::kokkos)
  return()
endif()

find_package(Kokkos 4 CONFIG QUIET)
if(Kokkos_FOUND)
  find_package(KokkosKernels CONFIG REQUIRED)
  add_library(Lather::kokkos INTERFACE IMPORTED GLOBAL)
  target_link_libraries(Lather::kokkos INTERFACE Kokkos::kokkos Kokkos::kokkoskernels)
  set(LATHER_KOKKOS_FLAVOR "kokkos")
  set(LATHER_KOKKOS_VERSION "${Kokkos_VERSION}")
else()
  find_package(KokkosKernels CONFIG QUIET)
  if(NOT KokkosKernels_FOUND OR NOT DEFINED KokkosKernels_INCLUDE_DIRS
     OR NOT DEFINED KokkosKernels_LIBRARIES)
    message(FATAL_ERROR
      "Lather needs Kokkos and Kokkos Kernels: either Kokkos >= 4 (set Kokkos_ROOT and "
      "KokkosKernels_ROOT) or the Debian packages libtrilinos-kokkos-dev and "
      "libtrilinos-kokkos-kernels-dev (scripts/install-deps installs them).")
  endif()
  add_library(Lather::kokkos INTERFACE IMPORTED GLOBAL)
  # The TriBITS library names are imported targets that the KokkosKernels config defines.
  set_target_properties(Lather::kokkos PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${KokkosKernels_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${KokkosKernels_LIBRARIES};${KokkosKernels_TPL_LIBRARIES}")
  set(LATHER_KOKKOS_FLAVOR "tribits")
  # TriBITS does not export a version; read the one Kokkos compiles with.
  set(LATHER_KOKKOS_VERSION "unknown")
  foreach(dir IN LISTS KokkosKernels_INCLUDE_DIRS)
    if(EXISTS "${dir}/KokkosCore_config.h")
      file(STRINGS "${dir}/KokkosCore_config.h" version_line REGEX "#define KOKKOS_VERSION ")
      if(version_line MATCHES "KOKKOS_VERSION ([0-9]+)")
        math(EXPR major "${CMAKE_MATCH_1} / 10000")
        math(EXPR minor "(${CMAKE_MATCH_1} / 100) % 100")
        math(EXPR patch "${CMAKE_MATCH_1} % 100")
        set(LATHER_KOKKOS_VERSION "${major}.${minor}.${patch}")
      endif()
    endif()
  endforeach()
endif()
