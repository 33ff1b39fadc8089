# The layering rules (docs/architecture.md §8), checked at configure time. A layer is a folder of
# the source tree; every gpuproxy target belongs to the layer of the folder it is defined in
# (gpuproxy_layer). A layer may depend only on the layers listed for it below, and on itself:
#
# - a target may link only targets of those layers;
# - a source or header in the layer's folder may #include only files of those layers (a header
#   included across a forbidden edge is as much a dependency as a link).
#
# A forbidden edge stops the configure step with a message naming it; so does a target in a layer
# that has no rule. The rules form no cycle: a layer lists only layers below it.
set(GPUPROXY_LAYER_protocol "")
set(GPUPROXY_LAYER_ipc "protocol")
set(GPUPROXY_LAYER_scheduler "")
# server/: one layer per part.
set(GPUPROXY_LAYER_server/backend "protocol;scheduler")
set(GPUPROXY_LAYER_server/backend/ptx "protocol")
set(GPUPROXY_LAYER_server/backend/fatbin "protocol")
set(GPUPROXY_LAYER_server/backend/sim
    "protocol;scheduler;server/backend;server/backend/ptx;server/backend/fatbin")
set(GPUPROXY_LAYER_server/backend/cuda
    "protocol;scheduler;server/backend;server/backend/ptx;server/backend/fatbin")
set(GPUPROXY_LAYER_server/tenant "protocol;scheduler")
set(GPUPROXY_LAYER_server/dispatch "protocol;scheduler;server/backend;server/tenant")
set(GPUPROXY_LAYER_server/gpu "protocol;scheduler;server/backend;server/tenant;server/dispatch")
set(GPUPROXY_LAYER_server/data_plane "protocol;ipc")
set(GPUPROXY_LAYER_server/session
    "protocol;ipc;scheduler;server/backend;server/tenant;server/dispatch;server/gpu;server/data_plane")
set(GPUPROXY_LAYER_server/admin
    "protocol;ipc;scheduler;server/backend;server/tenant;server/dispatch;server/gpu;server/data_plane;server/session")
set(GPUPROXY_LAYER_server/metrics "protocol")
set(GPUPROXY_LAYER_server/daemon
    "protocol;ipc;scheduler;server/backend;server/backend/ptx;server/backend/fatbin;server/backend/sim;server/backend/cuda;server/tenant;server/dispatch;server/gpu;server/data_plane;server/session;server/admin;server/metrics")
# gpuproxyd's main and the gpuproxy_server umbrella that tests and benchmarks link.
set(GPUPROXY_LAYER_server "${GPUPROXY_LAYER_server/daemon};server/daemon")
set(GPUPROXY_LAYER_client/stub "protocol;ipc")
set(GPUPROXY_LAYER_client/ctl "protocol;ipc")
set(GPUPROXY_LAYER_client/deviceplugin "protocol;ipc")

set_property(GLOBAL PROPERTY GPUPROXY_LAYERED_TARGETS "")

# Registers `target` as belonging to `layer` (its folder, relative to the source root; derived
# from where the target is defined when omitted).
function(gpuproxy_layer target)
  if(ARGC GREATER 1)
    set(layer ${ARGV1})
  else()
    file(RELATIVE_PATH layer ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  endif()
  set_property(TARGET ${target} PROPERTY GPUPROXY_LAYER ${layer})
  set_property(TARGET ${target} PROPERTY GPUPROXY_LAYER_DIR ${CMAKE_SOURCE_DIR}/${layer})
  set_property(GLOBAL APPEND PROPERTY GPUPROXY_LAYERED_TARGETS ${target})
endfunction()

# The layer a path relative to the source root (or an include path) lies in: the longest layer
# folder that prefixes it. Empty when none does (third-party and test headers).
function(gpuproxy_layer_of path layers out)
  # The Cap'n Proto headers are generated under gpuproxy/protocol/.
  string(REGEX REPLACE "^gpuproxy/protocol/" "protocol/" path "${path}")
  set(best "")
  foreach(layer IN LISTS layers)
    string(LENGTH "${layer}" length)
    string(LENGTH "${best}" bestLength)
    if(path MATCHES "^${layer}/" AND length GREATER bestLength)
      set(best ${layer})
    endif()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

function(gpuproxy_check_layering)
  get_property(targets GLOBAL PROPERTY GPUPROXY_LAYERED_TARGETS)
  set(layers "")
  foreach(target IN LISTS targets)
    get_target_property(layer ${target} GPUPROXY_LAYER)
    list(APPEND layers ${layer})
    if(NOT DEFINED GPUPROXY_LAYER_${layer})
      message(FATAL_ERROR "Layering: ${target} is in ${layer}/, which has no rule in "
                          "cmake/GpuproxyLayering.cmake (say what it may depend on)")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES layers)

  foreach(target IN LISTS targets)
    get_target_property(layer ${target} GPUPROXY_LAYER)
    set(allowed "${GPUPROXY_LAYER_${layer}}")

    # Links.
    get_target_property(type ${target} TYPE)
    set(links "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(links ${target} LINK_LIBRARIES)
    endif()
    get_target_property(interfaceLinks ${target} INTERFACE_LINK_LIBRARIES)
    foreach(link IN LISTS links interfaceLinks)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" link "${link}")
      string(REGEX REPLACE "^gpuproxy::" "gpuproxy_" link "${link}")
      if(NOT link MATCHES "^gpuproxy_" OR NOT TARGET ${link})
        continue()
      endif()
      get_property(linkLayer TARGET ${link} PROPERTY GPUPROXY_LAYER)
      if(NOT linkLayer OR linkLayer STREQUAL layer)
        continue()
      endif()
      if(NOT linkLayer IN_LIST allowed)
        message(FATAL_ERROR "Layering violation: ${target} (${layer}/) links ${link} "
                            "(${linkLayer}/), but ${layer}/ may depend only on: ${allowed}")
      endif()
    endforeach()

    # Includes, in every source and header of the layer's folder and its sub-folders, except the
    # sub-folders that are layers of their own.
    get_target_property(directory ${target} GPUPROXY_LAYER_DIR)
    file(GLOB_RECURSE files ${directory}/*.cpp ${directory}/*.hpp ${directory}/*.h)
    foreach(file IN LISTS files)
      file(RELATIVE_PATH relative ${CMAKE_SOURCE_DIR} ${file})
      gpuproxy_layer_of("${relative}" "${layers}" fileLayer)
      if(NOT fileLayer STREQUAL layer)
        continue()
      endif()
      file(STRINGS ${file} includes REGEX "^#include \"[^\"]+\"")
      foreach(line IN LISTS includes)
        string(REGEX REPLACE "^#include \"([^\"]+)\".*$" "\\1" included "${line}")
        gpuproxy_layer_of("${included}" "${layers}" includedLayer)
        if(NOT includedLayer OR includedLayer STREQUAL layer)
          continue()
        endif()
        if(NOT includedLayer IN_LIST allowed)
          message(FATAL_ERROR "Layering violation: ${relative} (${layer}/) includes \"${included}\" "
                              "(${includedLayer}/), but ${layer}/ may depend only on: ${allowed}")
        endif()
      endforeach()
    endforeach()
  endforeach()
endfunction()
