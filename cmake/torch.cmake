# libtorch: the one inside the `torch` wheel in the project's virtualenv (.venv, made by
# scripts/setup.sh), for the CPU and the CUDA build alike.
#
# Where a CUDA compiler is found (nvcc: on PATH, $CUDACXX or /usr/local/cuda), the build is the CUDA
# flavour: Loom's CUDA kernels compiled by nvcc, its CUDA host code (LOOM_TORCH_CUDA: devices,
# streams, the caching allocator, NCCL) compiled and linked against libtorch_cuda. Without one, a
# CPU-only `loom` links libtorch_cpu and libc10 from the same wheel.
#
# Sets TORCH_LIBRARIES (the target loom_torch), TORCH_CXX_FLAGS, LOOM_TORCH_CUDA, LOOM_NCCL, LOOM_CUDA
# and, in the CUDA build, LOOM_CUDART.

set(LOOM_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python3"
    CACHE FILEPATH "The Python whose torch package holds the libtorch Loom builds against")
execute_process(
  COMMAND "${LOOM_PYTHON}" -c
          "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0])"
  OUTPUT_VARIABLE LOOM_TORCH_PACKAGE OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE torch_found ERROR_QUIET)
if(NOT torch_found EQUAL 0 OR NOT EXISTS "${LOOM_TORCH_PACKAGE}/share/cmake/Torch/TorchConfig.cmake")
  message(FATAL_ERROR "No torch package in ${LOOM_PYTHON} (LOOM_PYTHON): run `bash scripts/setup.sh`, "
                      "which makes the project's virtualenv .venv with the pinned torch wheel")
endif()
get_filename_component(LOOM_SITE_PACKAGES "${LOOM_TORCH_PACKAGE}" DIRECTORY)

option(LOOM_CUDA_BUILD "Build the CUDA flavour where a CUDA compiler is found" ON)
# The GPUs the CUDA kernels are compiled for: A100, H100/H200.
set(LOOM_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures of Loom's kernels")

set(LOOM_TORCH_CUDA OFF)
set(LOOM_NCCL OFF)
set(LOOM_CUDA OFF)
include(CheckLanguage)
if(LOOM_CUDA_BUILD)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
endif()

# Torch's own CMake package is not used: it loads only with a CUDA toolkit and links the toolkit's
# runtime libraries beside the wheel's (two copies of libcudart.so.13 and libnccl.so.2 on the search
# path). Loom links the wheel's libraries, and only them.
set(torch_lib "${LOOM_TORCH_PACKAGE}/lib")
set(nvidia "${LOOM_SITE_PACKAGES}/nvidia")
add_library(loom_torch INTERFACE)
target_include_directories(loom_torch SYSTEM INTERFACE "${LOOM_TORCH_PACKAGE}/include"
                                                      "${LOOM_TORCH_PACKAGE}/include/torch/csrc/api/include")
target_link_libraries(loom_torch INTERFACE "${torch_lib}/libtorch_cpu.so" "${torch_lib}/libc10.so")
# As the wheel was built: the C++11 ABI, c10d with Gloo.
target_compile_definitions(loom_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1 USE_DISTRIBUTED USE_C10D_GLOO)
set(TORCH_LIBRARIES loom_torch)
set(TORCH_CXX_FLAGS)

if(LOOM_CUDA_BUILD AND CMAKE_CUDA_COMPILER)
  if(NOT EXISTS "${torch_lib}/libtorch_cuda.so")
    message(FATAL_ERROR "${LOOM_TORCH_PACKAGE} is a CPU-only torch: the CUDA build needs the CUDA wheel "
                        "(or configure with -DLOOM_CUDA_BUILD=OFF)")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${LOOM_CUDA_ARCHITECTURES})
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 dialect for nvcc; nvcc 12 and later take -std=c++20.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(LOOM_TORCH_CUDA ON)
  set(LOOM_CUDA ON)
  add_compile_definitions(LOOM_TORCH_CUDA)
  # The CUDA runtime and headers libtorch_cuda was built with (the wheel's nvidia-cuda-runtime),
  # for Loom's host code and kernels too.
  # (CUDA 13 wheels keep it in nvidia/cu13, CUDA 12 ones in nvidia/cuda_runtime.)
  file(GLOB cudart_found "${nvidia}/cu*/lib/libcudart.so.*" "${nvidia}/cuda_runtime/lib/libcudart.so.*")
  list(FILTER cudart_found INCLUDE REGEX "libcudart\\.so\\.[0-9]+$")
  if(NOT cudart_found)
    message(FATAL_ERROR "The torch wheel's CUDA runtime (${nvidia}/cu13/lib/libcudart.so.13) was not found")
  endif()
  list(GET cudart_found 0 LOOM_CUDART)
  get_filename_component(cudart_dir "${LOOM_CUDART}" DIRECTORY)
  target_include_directories(loom_torch SYSTEM INTERFACE "${cudart_dir}/../include")
  target_link_libraries(loom_torch INTERFACE "${torch_lib}/libtorch_cuda.so" "${torch_lib}/libc10_cuda.so"
                                             ${LOOM_CUDART})
  # NCCL as the wheel's nvidia-nccl package ships it, the one libtorch_cuda loads.
  find_path(LOOM_NCCL_INCLUDE nccl.h HINTS "${nvidia}/nccl/include" NO_DEFAULT_PATH)
  find_library(LOOM_NCCL_LIBRARY NAMES libnccl.so.2 HINTS "${nvidia}/nccl/lib" NO_DEFAULT_PATH)
  if(LOOM_NCCL_INCLUDE AND LOOM_NCCL_LIBRARY)
    set(LOOM_NCCL ON)
    target_compile_definitions(loom_torch INTERFACE USE_C10D_NCCL)
    target_include_directories(loom_torch SYSTEM INTERFACE ${LOOM_NCCL_INCLUDE})
    target_link_libraries(loom_torch INTERFACE ${LOOM_NCCL_LIBRARY})
  else()
    message(WARNING "The torch wheel's nvidia-nccl package was not found: CUDA jobs run on one GPU only")
  endif()
else()
  message(STATUS "No CUDA compiler: a CPU-only build against ${LOOM_TORCH_PACKAGE}")
endif()
message(STATUS "Loom CUDA jobs: ${LOOM_TORCH_CUDA}   NCCL: ${LOOM_NCCL}   CUDA kernels: ${LOOM_CUDA}")

# The wheel ships headers of libraries Loom takes from Debian (fmt 12 beside Debian's fmt 9, which
# libspdlog and libfmt.so were built with). Debian's copies are put before the wheel's include
# folder, so every translation unit, the torch headers' own uses included, sees one version.
set(LOOM_FIRST_INCLUDE "${CMAKE_BINARY_DIR}/first-include")
file(MAKE_DIRECTORY "${LOOM_FIRST_INCLUDE}")
get_target_property(fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
foreach(name fmt)
  if(EXISTS "${LOOM_TORCH_PACKAGE}/include/${name}" AND EXISTS "${fmt_include}/${name}")
    file(CREATE_LINK "${fmt_include}/${name}" "${LOOM_FIRST_INCLUDE}/${name}" SYMBOLIC)
  endif()
endforeach()
include_directories(BEFORE SYSTEM "${LOOM_FIRST_INCLUDE}")
