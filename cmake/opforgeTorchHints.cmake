# Helps find_package(Torch) find what a CUDA build of torch needs, with no variables set by hand:
#  - the CUDA toolkit (nvcc on PATH may be a wrapper script outside the toolkit), and
#  - the CUDA libraries installed by pip's nvidia-* wheels (libnvrtc, ...), which torch's CMake
#    config asks for but a toolkit may lack.
# Included by opforge's CMakeLists.txt and by the installed opforgeConfig.cmake.

if(NOT CUDA_TOOLKIT_ROOT_DIR)
  set(_opforge_cuda_candidates "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_opforge_nvcc_dir "${CMAKE_CUDA_COMPILER}" REALPATH)
    get_filename_component(_opforge_nvcc_dir "${_opforge_nvcc_dir}" DIRECTORY)
    list(APPEND _opforge_cuda_candidates "${_opforge_nvcc_dir}/..")
  endif()
  list(APPEND _opforge_cuda_candidates /usr/local/cuda /opt/cuda)
  foreach(_dir IN LISTS _opforge_cuda_candidates)
    if(_dir AND EXISTS "${_dir}/include/cuda_runtime.h")
      get_filename_component(_dir "${_dir}" REALPATH)
      set(CUDA_TOOLKIT_ROOT_DIR "${_dir}" CACHE PATH "CUDA toolkit used by torch's CMake config")
      break()
    endif()
  endforeach()
endif()

# A pip-installed torch: CMAKE_PREFIX_PATH = <site-packages>/torch/share/cmake, or
# Torch_DIR = <site-packages>/torch/share/cmake/Torch; its CUDA wheels: <site-packages>/nvidia/*/.
set(_opforge_nvidia_lib_dirs "")
set(OPFORGE_NVIDIA_INCLUDE_DIRS "")
foreach(_site IN ITEMS ${CMAKE_PREFIX_PATH} ${Torch_DIR})
  foreach(_up IN ITEMS "../../.." "../../../..")
    file(GLOB _libs "${_site}/${_up}/nvidia/*/lib")
    file(GLOB _incs "${_site}/${_up}/nvidia/*/include")
    list(APPEND _opforge_nvidia_lib_dirs ${_libs})
    list(APPEND OPFORGE_NVIDIA_INCLUDE_DIRS ${_incs})
  endforeach()
endforeach()
list(REMOVE_DUPLICATES OPFORGE_NVIDIA_INCLUDE_DIRS)
if(_opforge_nvidia_lib_dirs)
  if(NOT CUDA_nvrtc_LIBRARY)
    find_library(CUDA_nvrtc_LIBRARY NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12 HINTS ${_opforge_nvidia_lib_dirs})
  endif()
endif()
