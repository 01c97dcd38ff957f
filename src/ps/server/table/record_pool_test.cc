// Tests of the disk tier's record memory (record_pool.h).
#include "ps/server/table/record_pool.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace psflow::ps::table {
namespace {

TEST(RecordPoolTest, BlocksAreAlignedDistinctAndKeepTheirBytes) {
  RecordPool pool;
  std::vector<void*> blocks;
  for (int i = 0; i < 10000; ++i) {  // several slabs of 576-byte blocks
    void* b = pool.Allocate(576);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
    std::memset(b, i & 0xff, 576);
    blocks.push_back(b);
  }
  EXPECT_EQ(std::set<void*>(blocks.begin(), blocks.end()).size(), blocks.size());
  for (int i = 0; i < 10000; ++i) {
    const auto* p = static_cast<const unsigned char*>(blocks[i]);
    ASSERT_EQ(p[0], i & 0xff);
    ASSERT_EQ(p[575], i & 0xff);
  }
  // 3640 blocks of 576 bytes a 2 MiB slab: 10000 need 3 slabs.
  EXPECT_EQ(pool.slab_bytes(), 3 * RecordPool::kSlabBytes);
  for (void* b : blocks) pool.Free(b);
}

TEST(RecordPoolTest, ReplacingRecordsAtRandomKeepsTheSlabsTheRecordsNeed) {
  // aligned_alloc took 38 % more than the records here; the pool must stay within one slab of them.
  RecordPool pool;
  constexpr int kLive = 20000;
  std::vector<void*> blocks;
  for (int i = 0; i < kLive; ++i) blocks.push_back(pool.Allocate(576));
  const int64_t slabs = pool.slab_bytes();
  std::mt19937 rng(1);
  for (int r = 0; r < 5 * kLive; ++r) {
    const size_t i = rng() % blocks.size();
    pool.Free(blocks[i]);
    blocks[i] = pool.Allocate(576);
  }
  EXPECT_EQ(pool.slab_bytes(), slabs);
  for (void* b : blocks) pool.Free(b);
  EXPECT_EQ(pool.slab_bytes(), RecordPool::kSlabBytes);  // empty slabs go back, the last one stays
}

TEST(RecordPoolTest, SizesHaveTheirOwnSlabsAndEmptySlabsGoBack) {
  RecordPool pool;
  void* a = pool.Allocate(100);  // a 128-byte block
  void* b = pool.Allocate(576);
  EXPECT_EQ(pool.slab_bytes(), 2 * RecordPool::kSlabBytes);
  EXPECT_NE(reinterpret_cast<uintptr_t>(a) / RecordPool::kSlabBytes,
            reinterpret_cast<uintptr_t>(b) / RecordPool::kSlabBytes);
  std::vector<void*> many;
  for (int i = 0; i < 20000; ++i) many.push_back(pool.Allocate(100));  // 16383 a slab: two slabs
  EXPECT_EQ(pool.slab_bytes(), 3 * RecordPool::kSlabBytes);
  for (void* m : many) pool.Free(m);
  pool.Free(a);
  EXPECT_EQ(pool.slab_bytes(), 2 * RecordPool::kSlabBytes);  // one slab of each size kept
  pool.Free(b);
}

}  // namespace
}  // namespace psflow::ps::table
