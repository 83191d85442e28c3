// The tuning file (comm/tuning.hpp), which TUTTI_TUNING_FILE names: the fuzzer's bytes are the
// file. Parsing either gives a table or throws Error(invalid_argument) (nothing else may escape);
// a table it gives must write back (to_json) into a file that parses to the same table, and
// every entry must be found by a lookup inside its own range.
#include <string>

#include "comm/tuning.hpp"
#include "fuzz_support.hpp"

using tutti::comm::choice::Table;
using tutti::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Table table;
  try {
    table = Table::parse(text, "fuzz.json");
  } catch (const tutti::Error& error) {
    require(error.code() == tutti::ErrorCode::invalid_argument, "a bad tuning file gave another error code");
    return 0;
  }
  const std::string written = table.to_json();
  Table again;
  try {
    again = Table::parse(written, "written.json");
  } catch (const tutti::Error& error) {
    std::fprintf(stderr, "%s\n", error.what());
    require(false, "a table that parsed does not parse once written back");
  }
  require(again.to_json() == written, "a written table parses to another table");
  for (const auto& entry : table.entries) {
    require(entry.min_bytes <= entry.max_bytes, "an entry with min_bytes > max_bytes was accepted");
    require(table.lookup(entry.collective, entry.transport, entry.ranks, entry.max_bytes).has_value(),
            "an entry is not found inside its own range");
  }
  for (const auto& entry : table.backend_entries) {
    require(entry.min_bytes <= entry.max_bytes, "a backend entry with min_bytes > max_bytes was accepted");
    require(table.lookup_backend(entry.collective, entry.transport, entry.ranks, entry.max_bytes).has_value(),
            "a backend entry is not found inside its own range");
  }
  return 0;
}
