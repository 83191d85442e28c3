# Gloo as a peer of tutti-bench (benchmark only: the library never needs it). Debian's libgloo-dev
# ships GlooConfig.cmake with one imported target, `gloo`; its headers are in /usr/include.

# Adds gloo_peer.cpp to `target`: with Gloo (TUTTI_WITH_GLOO, linked to `gloo`) when CMake finds
# it, otherwise without, where GlooPeer::available() is false and tutti-bench says so.
function(tutti_bench_use_gloo target)
  find_package(Gloo CONFIG QUIET)
  set(source "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/gloo_peer.cpp")
  if(Gloo_FOUND AND TARGET gloo)
    message(STATUS "Gloo ${GLOO_VERSION} found: tutti-bench times Gloo's collectives as a peer")
    target_sources(${target} PRIVATE "${source}")
    target_compile_definitions(${target} PRIVATE TUTTI_WITH_GLOO)
    # The imported target names no dependencies, but libgloo runs its own threads.
    find_package(Threads REQUIRED)
    target_link_libraries(${target} PRIVATE gloo Threads::Threads)
  else()
    message(STATUS "Gloo not found: tutti-bench's Gloo peer is disabled")
    target_sources(${target} PRIVATE "${source}")
  endif()
endfunction()
