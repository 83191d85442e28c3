# Sourced by the checks that `pip install` a copy of the sources at WORK/src (tests/python/
# pip_install_test.sh, scripts/torch2_check.sh); needs $work. Sets pip_settings, the
# --config-settings they build with:
#   - CMake's build type None (no optimisation, no debug information): the checks are functional,
#     and that halves their compile time on 2 cores;
#   - the build directory WORK/pip-build (kept by torch2_check.sh: a second run recompiles only
#     what changed);
#   - where ccache is installed, ccache as the compiler launcher with base_dir WORK: the library's
#     own sources, which do not include torch or Python, then compile to the same cache entries in
#     both checks, so a run of both compiles them once.
pip_settings=(--config-settings=cmake.build-type=None --config-settings=build-dir="$work/pip-build")
if command -v ccache >/dev/null; then
  pip_settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$work
fi
