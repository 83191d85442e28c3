// Builds against an installed Tutti and runs a 3-rank allreduce on threads.
#include <cstdio>
#include <thread>
#include <vector>

#include <tutti/tutti.hpp>

int main() {
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
  std::printf("consumer: find_package(Tutti) works, allreduce over 3 threads = 6\n");
  return 0;
}
