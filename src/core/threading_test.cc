#include "psflow/core/threading.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace psflow {
namespace {

class ThreadingTest : public ::testing::Test {
 protected:
  void TearDown() override { SetIntraOpThreads(saved_); }
  int saved_ = IntraOpThreads();
};

TEST_F(ThreadingTest, SetAndGet) {
  SetIntraOpThreads(2);
  EXPECT_EQ(IntraOpThreads(), 2);
  SetIntraOpThreads(1);
  EXPECT_EQ(IntraOpThreads(), 1);
  SetIntraOpThreads(0);  // the machine's default
  EXPECT_GE(IntraOpThreads(), 1);
}

TEST_F(ThreadingTest, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    SetIntraOpThreads(threads);
    for (int64_t n : {0, 1, 7, 100, 10001}) {
      for (int64_t min_block : {1, 16, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        ParallelFor(n, min_block, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << min_block << " " << i;
      }
    }
  }
}

TEST_F(ThreadingTest, BlocksAreADeterministicFunctionOfSizeAndThreads) {
  SetIntraOpThreads(2);
  auto blocks = [] {
    std::vector<std::pair<int64_t, int64_t>> out(2, {-1, -1});
    std::atomic<int> count{0};
    ParallelFor(1000, 10, [&](int64_t b, int64_t e) { out[count++] = {b, e}; });
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto expected = std::vector<std::pair<int64_t, int64_t>>{{0, 500}, {500, 1000}};
  for (int i = 0; i < 20; ++i) ASSERT_EQ(blocks(), expected);
}

TEST_F(ThreadingTest, NestedAndConcurrentCallsComplete) {
  SetIntraOpThreads(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        ParallelFor(64, 1, [&](int64_t b, int64_t e) {
          ParallelFor(e - b, 1, [&](int64_t nb, int64_t ne) { total += ne - nb; });
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 200 * 64);
}

// Denormals are flushed to zero (as TensorFlow's kernels do) in every build, the portable
// SSE2-baseline one included: results must not depend on the CPU or on -march.
TEST_F(ThreadingTest, FlushDenormalsMakesDenormalResultsAndInputsZero) {
  std::thread([] {
    FlushDenormalsOnThisThread();
    volatile float tiny = 1e-30f;
    volatile float scale = 1e-10f;
    EXPECT_EQ(tiny * scale, 0.0f);  // 1e-40 is a denormal: flushed (FTZ)
    volatile float denormal_bits = 0;
    const uint32_t bits = 0x00000100;  // a denormal input
    std::memcpy(const_cast<float*>(&denormal_bits), &bits, sizeof(bits));
    EXPECT_EQ(denormal_bits * 1.0f, 0.0f);  // read as zero (DAZ)
  }).join();
}

}  // namespace
}  // namespace psflow
