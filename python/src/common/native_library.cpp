// libtutti_native.so, the one native library of the Python package (python/CMakeLists.txt): the
// whole of libtutti, linked in from the static library. This file only gives the target a source.
namespace tutti_python {
int native_library_marker = 0;
}  // namespace tutti_python
