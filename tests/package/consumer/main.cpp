// Builds against an installed Tutti (find_package(Tutti), or pkg-config tutti) and runs a 3-rank
// allreduce on threads; the headers it was compiled with must be those of the library it runs with.
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <tutti/tutti.hpp>

int main() {
  if (std::strcmp(tutti::version(), TUTTI_VERSION_STRING) != 0) {
    std::printf("consumer: headers %s, library %s\n", TUTTI_VERSION_STRING, tutti::version());
    return 1;
  }
  auto comms = tutti::local_group(3);
  std::vector<int> results(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      int value = r + 1;
      comms[r].allreduce(&value, &results[r], 1, tutti::DataType::i32, tutti::ReduceOp::sum);
    });
  for (auto& t : threads) t.join();
  for (int v : results)
    if (v != 6) {
      std::printf("consumer: wrong result %d\n", v);
      return 1;
    }
  std::printf("consumer: Tutti %s, allreduce over 3 threads = 6\n", tutti::version());
  return 0;
}
