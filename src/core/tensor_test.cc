#include "psflow/core/tensor.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <numeric>

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
