// Tests of the disk tier's read threads (read_pool.h).
#include "ps/server/table/read_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace psflow::ps::table {
namespace {

TEST(ReadPoolTest, EveryPartRunsOnceBeforeRunPartsReturns) {
  for (int threads : {0, 1, 3}) {
    ReadPool pool(threads);
    for (size_t parts : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{64}}) {
      std::vector<std::atomic<int>> ran(parts);
      pool.RunParts(parts, [&](size_t k) { ran[k].fetch_add(1); });
      for (size_t k = 0; k < parts; ++k) EXPECT_EQ(ran[k].load(), 1) << threads << " threads, part " << k;
    }
  }
}

TEST(ReadPoolTest, CallersFromSeveralThreadsShareThePool) {
  ReadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        std::atomic<int64_t> mine{0};
        pool.RunParts(5, [&](size_t k) { mine.fetch_add(static_cast<int64_t>(k) + 1); });
        EXPECT_EQ(mine.load(), 15);  // every part of this call, done when it returned
        sum.fetch_add(mine.load());
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 200 * 15);
}

}  // namespace
}  // namespace psflow::ps::table
