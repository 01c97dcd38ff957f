# psflow's third-party dependencies, found the one way for psflow's own build (CMakeLists.txt) and
# for a project using the installed package (psflowConfig.cmake includes this file, installed next
# to it). Every one is a Debian 12 package (scripts/setup.sh). Defines the imported targets
# OpenBLAS::OpenBLAS and DNNL::dnnl, which psflow_core links; Eigen is private to psflow_core's
# sources and not needed here. GTest and Google Benchmark are psflow's tests' and benchmarks' only,
# found where those are built. Set PSFLOW_DEPENDENCY_FIND to find_package or find_dependency first.
if(NOT PSFLOW_DEPENDENCY_FIND)
  set(PSFLOW_DEPENDENCY_FIND find_package)
endif()
macro(_psflow_find)
  if(PSFLOW_DEPENDENCY_FIND STREQUAL "find_dependency")
    find_dependency(${ARGN})
  else()
    find_package(${ARGN} REQUIRED)
  endif()
endmacro()

_psflow_find(Threads)
_psflow_find(absl)
_psflow_find(Protobuf)
# gRPC's package prints "Could NOT find c-ares (missing: c-ares_DIR)" and then finds c-ares through
# its own Find module: harmless (Debian ships no c-ares CMake config).
_psflow_find(gRPC CONFIG)
_psflow_find(ZLIB)
_psflow_find(nlohmann_json 3)
_psflow_find(OpenMP COMPONENTS CXX)  # oneDNN's OpenMP runtime (psflow_core links it privately)
# Debian's cpp-httplib is a compiled library whose header must see the feature macros it was built
# with: it comes through its pkg-config file (psflow_metrics links it privately).
_psflow_find(PkgConfig)
if(NOT TARGET PkgConfig::HTTPLIB)
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
# RocksDB (Debian's librocksdb-dev, 7.8): the disk tier of embedding tables (psflow_ps_table links it
# privately), through its pkg-config file (Debian ships no CMake config for it).
if(NOT TARGET PkgConfig::ROCKSDB)
  pkg_check_modules(ROCKSDB REQUIRED IMPORTED_TARGET rocksdb)
endif()

# Debian's dnnl CMake package also demands OpenCL headers; the CPU path needs only the library.
if(NOT TARGET DNNL::dnnl)
  find_library(PSFLOW_DNNL_LIB NAMES dnnl REQUIRED)
  find_path(PSFLOW_DNNL_INCLUDE NAMES oneapi/dnnl/dnnl.hpp REQUIRED)
  add_library(DNNL::dnnl INTERFACE IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES INTERFACE_LINK_LIBRARIES "${PSFLOW_DNNL_LIB}"
                        INTERFACE_INCLUDE_DIRECTORIES "${PSFLOW_DNNL_INCLUDE}")
endif()
if(NOT TARGET OpenBLAS::OpenBLAS)
  find_library(PSFLOW_OPENBLAS_LIB NAMES openblas REQUIRED)
  find_path(PSFLOW_OPENBLAS_INCLUDE NAMES cblas.h
            PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas REQUIRED)
  add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES INTERFACE_LINK_LIBRARIES "${PSFLOW_OPENBLAS_LIB}"
                        INTERFACE_INCLUDE_DIRECTORIES "${PSFLOW_OPENBLAS_INCLUDE}")
endif()
