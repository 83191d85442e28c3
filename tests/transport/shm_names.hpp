// Names of the shared-memory segments a test makes, and the ones it left behind in /dev/shm.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

namespace tutti::testing {

/// What every segment name of this test process starts with.
inline std::string shm_prefix() { return "tutti-test-" + std::to_string(getpid()) + "-"; }

/// A segment name no other call of this process returns.
inline std::string unique_shm_name() {
  static std::atomic<int> counter{0};
  return shm_prefix() + std::to_string(counter++);
}

/// The segments of this process still in /dev/shm.
inline std::vector<std::string> shm_leftovers() {
  std::vector<std::string> found;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir))
      if (std::string(entry->d_name).rfind(shm_prefix(), 0) == 0) found.push_back(entry->d_name);
    closedir(dir);
  }
  return found;
}

}  // namespace tutti::testing
