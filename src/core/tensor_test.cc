#include "psflow/core/tensor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>

#include "core/block_cache.h"

namespace psflow {
namespace {

Tensor Iota(Shape shape) {
  Tensor t(std::move(shape));
  std::iota(t.span().begin(), t.span().end(), 0.0f);
  return t;
}

// Resident bytes of this process (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A freed big tensor's block is kept for the next tensor of its size (same block, still
// resident); ReleaseCachedBlocks hands it back to the system.
TEST(TensorAllocatorTest, BigBlocksAreRecycledUntilReleased) {
  const int64_t floats = int64_t{64} << 20;  // 256 MiB
  const float* first = nullptr;
  {
    Tensor t({floats}, 1.0f);
    first = t.data();
  }
  const int64_t cached = ResidentBytes();
  {
    Tensor again({floats}, 2.0f);
    EXPECT_EQ(again.data(), first) << "the freed block was not recycled";
  }
  EXPECT_GT(ResidentBytes(), int64_t{200} << 20) << "the cached block is no longer resident";
  internal::ReleaseCachedBlocks();
  EXPECT_LT(ResidentBytes(), cached - (int64_t{200} << 20)) << "the released block is still resident";
}

// A buffer whose size jitters from step to step (a table's per-ps block: as many rows of dim 64
// as a step's random ids fall on that ps) keeps the cache at the few blocks of its size classes,
// not one cached block per size it ever had (which grew the RSS with the number of steps).
TEST(TensorAllocatorTest, JitteringSizesShareAFewCachedBlocks) {
  internal::ReleaseCachedBlocks();
  const size_t row_floats = 64, mean_rows = 2048;  // 512 KiB blocks
  size_t max_bytes = 0;
  for (size_t step = 0; step < 600; ++step) {
    const size_t rows = mean_rows - 150 + (step * 7919) % 301;  // 301 distinct sizes, ±150 rows
    max_bytes = std::max(max_bytes, (rows * row_floats) * sizeof(float));
    FloatBuffer a(rows * row_floats, 1.0f);                    // freed at the end of the step
    FloatBuffer b((mean_rows * 2 - rows) * row_floats, 2.0f);  // the other ps's share
    ASSERT_EQ(a.back(), 1.0f);
    ASSERT_EQ(b.back(), 2.0f);
  }
  // Both buffers lie within [1898, 2198] rows: 450 KiB .. 550 KiB, classes of 32 KiB (1/16 of
  // 512 KiB) or 16 KiB (1/16 of 256 KiB): at most 8 classes, each holding at most the 2 blocks
  // alive at once. Cached by exact size, the 301 sizes would keep ~150 MiB.
  EXPECT_LE(internal::CachedBlockBytes(), 8 * 2 * (max_bytes + max_bytes / 16));
  EXPECT_GT(internal::CachedBlockBytes(), 0u) << "the blocks were not recycled at all";
  internal::ReleaseCachedBlocks();
  EXPECT_EQ(internal::CachedBlockBytes(), 0u);
}

// A block is reused for a smaller or equal request of its class, and a request above the class
// gets a block of its own (the recycled block is never too small).
TEST(TensorAllocatorTest, ClassReuseNeverHandsOutATooSmallBlock) {
  internal::ReleaseCachedBlocks();
  const size_t kib = 1024;
  // 1 MiB's class step is 64 KiB: 1 MiB + 1 byte .. 1 MiB + 64 KiB is one class.
  void* p = internal::AllocateAlignedBlock(1024 * kib + 64 * kib);
  std::memset(p, 7, 1024 * kib + 64 * kib);
  internal::FreeAlignedBlock(p, 1024 * kib + 64 * kib);
  EXPECT_EQ(internal::CachedBlockBytes(), 1024 * kib + 64 * kib);
  void* q = internal::AllocateAlignedBlock(1024 * kib + 1);
  EXPECT_EQ(q, p) << "a request of the same class did not reuse the cached block";
  EXPECT_EQ(internal::CachedBlockBytes(), 0u);
  internal::FreeAlignedBlock(q, 1024 * kib + 1);
  void* r = internal::AllocateAlignedBlock(1024 * kib + 64 * kib + 1);  // the next class
  EXPECT_NE(r, p) << "a larger request was given a block of a smaller class";
  std::memset(r, 7, 1024 * kib + 64 * kib + 1);
  internal::FreeAlignedBlock(r, 1024 * kib + 64 * kib + 1);
  EXPECT_EQ(internal::CachedBlockBytes(), (1024 * kib + 64 * kib) + (1024 * kib + 128 * kib));
  internal::ReleaseCachedBlocks();
}

TEST(TensorTest, ConstructionShapesAndAlignment) {
  Tensor t({2, 3}, 1.5f);
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t[5], 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_TRUE(Tensor().empty());
  EXPECT_EQ(Tensor::Scalar(3).size(), 1);
  Tensor u = Tensor::Uninitialized({4, 5});
  EXPECT_EQ(u.shape(), (Shape{4, 5}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(u.data()) % 64, 0u);
  EXPECT_EQ(Tensor({3}).span()[2], 0.0f);  // the plain constructor still zero-fills
  EXPECT_EQ(ShapeToString({2, 3, 4}), "[2,3,4]");
}

TEST(TensorTest, SliceValuesAlongEachAxis) {
  const Tensor t = Iota({2, 3, 4});
  const Tensor s = t.Slice(1, 1, 3);  // rows 1..2 of axis 1
  ASSERT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(s[0], 4.0f);   // t[0,1,0]
  EXPECT_EQ(s[8], 16.0f);  // t[1,1,0]
  const Tensor last = t.Slice(2, 3, 4);
  ASSERT_EQ(last.shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(last[1], 7.0f);  // t[0,1,3]
}

TEST(TensorTest, SliceConcatRoundTripOnEveryAxis) {
  const Tensor t = Iota({5, 4, 3});
  for (int axis = 0; axis < 3; ++axis) {
    const int64_t d = t.dim(axis);
    std::vector<Tensor> parts = {t.Slice(axis, 0, 1), t.Slice(axis, 1, d - 1), t.Slice(axis, d - 1, d)};
    const Tensor back = Tensor::Concat(parts, axis);
    ASSERT_EQ(back.shape(), t.shape());
    for (int64_t i = 0; i < t.size(); ++i) ASSERT_EQ(back[i], t[i]) << "axis " << axis << " at " << i;
    Tensor assigned(t.shape());
    int64_t at = 0;
    for (const Tensor& p : parts) {
      assigned.AssignSlice(axis, at, p);
      at += p.dim(axis);
    }
    for (int64_t i = 0; i < t.size(); ++i) ASSERT_EQ(assigned[i], t[i]);
  }
}

TEST(TensorTest, ReshapeKeepsDataAndCopiesAreDeep) {
  Tensor t = Iota({2, 6});
  Tensor r = t.Reshaped({3, 4});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  r[0] = 100;
  EXPECT_EQ(t[0], 0.0f);
  EXPECT_EQ(r[11], 11.0f);
}

}  // namespace
}  // namespace psflow
