// Reads a model profile with tutti::sim::read_profile_file and writes it back (write_profile) to
// stdout, for tests of the programs that write profiles (train_profile_test.sh).
//
//   profile_check_program FILE    exit 0; 1 with the reader's error on stderr
#include <cstdio>
#include <exception>
#include <iostream>

#include "tutti/sim.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fputs("usage: profile_check_program FILE\n", stderr);
    return 2;
  }
  try {
    tutti::sim::write_profile(std::cout, tutti::sim::read_profile_file(argv[1]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_check_program: %s\n", e.what());
    return 1;
  }
  return 0;
}
