#include "tutti/version.hpp"

namespace tutti {

// The macro as this translation unit sees it: the library's own version, whatever headers the
// caller was compiled with.
const char* version() noexcept { return TUTTI_VERSION_STRING; }

}  // namespace tutti
