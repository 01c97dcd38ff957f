#include "psflow/core/tensor.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/block_cache.h"
#include "core/check.h"

namespace psflow {
namespace internal {
namespace {

constexpr std::size_t kAlignment = 64;
// Blocks from this size on are recycled; smaller ones are malloc's business.
constexpr std::size_t kMinRecycledBytes = 256 * 1024;
// Upper bound of the bytes kept for reuse; beyond it, freed blocks go back to the system.
constexpr std::size_t kMaxRecycledBytes = std::size_t{1} << 30;
// Size classes per doubling: a recycled block is 2^k + j * 2^k / kClassesPerDoubling bytes.
constexpr int kClassesPerDoubling = 16;

// The size class of a recycled request: `bytes` rounded up to the next multiple of 1/16 of the
// power of two below it (at most 6.25% more). Blocks are cached and handed out by class, not by
// exact size: a buffer whose size jitters from step to step (a table block of however many of a
// step's random ids one ps owns, ±a few hundred rows around the mean) reuses the few blocks of
// its classes instead of leaving one cached block behind per size it ever had, which grew a
// worker's and a ps's RSS with the number of steps until the 1 GiB bound.
std::size_t ClassBytes(std::size_t bytes) {
  const std::size_t step = (std::size_t{1} << (std::bit_width(bytes) - 1)) / kClassesPerDoubling;
  return (bytes + step - 1) / step * step;
}

class BlockCache {
 public:
  void* Take(std::size_t bytes) {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    cached_bytes_ -= bytes;
    return p;
  }
  // False when the cache is full (the caller frees the block).
  bool Give(void* p, std::size_t bytes) {
    absl::MutexLock lock(&mu_);
    if (cached_bytes_ + bytes > kMaxRecycledBytes) return false;
    free_[bytes].push_back(p);
    cached_bytes_ += bytes;
    return true;
  }
  void ReleaseAll() {
    absl::MutexLock lock(&mu_);
    for (auto& [bytes, blocks] : free_) {
      for (void* p : blocks) ::operator delete(p, std::align_val_t(kAlignment));
    }
    free_.clear();
    cached_bytes_ = 0;
  }
  std::size_t cached_bytes() {
    absl::MutexLock lock(&mu_);
    return cached_bytes_;
  }

 private:
  absl::Mutex mu_;
  // Free blocks by size class (ClassBytes).
  std::unordered_map<std::size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
  std::size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

BlockCache& Cache() {
  static BlockCache* cache = new BlockCache();  // never destroyed: tensors may outlive statics
  return *cache;
}

}  // namespace

void* AllocateAlignedBlock(std::size_t bytes) {
  if (bytes >= kMinRecycledBytes) {
    const std::size_t cls = ClassBytes(bytes);
    if (void* p = Cache().Take(cls)) return p;
    return ::operator new(cls, std::align_val_t(kAlignment));
  }
  return ::operator new(bytes, std::align_val_t(kAlignment));
}

void FreeAlignedBlock(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  if (bytes >= kMinRecycledBytes && Cache().Give(p, ClassBytes(bytes))) return;
  ::operator delete(p, std::align_val_t(kAlignment));
}

std::size_t CachedBlockBytes() { return Cache().cached_bytes(); }

void ReleaseCachedBlocks() { Cache().ReleaseAll(); }

}  // namespace internal

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << ']';
  return out.str();
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), data_(NumElements(shape_), 0.0f) {}

Tensor::Tensor(Shape shape, float fill) : shape_(std::move(shape)), data_(NumElements(shape_), fill) {}

Tensor::Tensor(Shape shape, std::vector<float> values) : shape_(std::move(shape)), data_(values.begin(), values.end()) {
  CHECK_EQ(NumElements(shape_), static_cast<int64_t>(data_.size()))
      << "Tensor: " << values.size() << " values for shape " << ShapeToString(shape_);
}

Tensor Tensor::Uninitialized(Shape shape) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.data_.resize(NumElements(t.shape_));
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  Tensor t = *this;
  t.Reshape(std::move(shape));
  return t;
}

void Tensor::Reshape(Shape shape) {
  CHECK_EQ(NumElements(shape), size()) << "Reshape " << ShapeToString(shape_) << " to " << ShapeToString(shape);
  shape_ = std::move(shape);
}

namespace {
// Splits a shape around `axis`: outer = product of dims before, inner = product after.
void OuterInner(const Shape& s, int axis, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < axis; ++i) *outer *= s[i];
  for (size_t i = axis + 1; i < s.size(); ++i) *inner *= s[i];
}
}  // namespace

Tensor Tensor::Slice(int axis, int64_t begin, int64_t end) const {
  CHECK(axis >= 0 && axis < rank()) << "Slice axis " << axis << " of " << ShapeToString(shape_);
  CHECK(begin >= 0 && begin <= end && end <= shape_[axis]) << "Slice [" << begin << "," << end << ")";
  Shape out_shape = shape_;
  out_shape[axis] = end - begin;
  Tensor out(out_shape);
  int64_t outer, inner;
  OuterInner(shape_, axis, &outer, &inner);
  const int64_t rows = end - begin;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + o * rows * inner, data() + (o * shape_[axis] + begin) * inner,
                rows * inner * sizeof(float));
  }
  return out;
}

void Tensor::AssignSlice(int axis, int64_t begin, const Tensor& part) {
  CHECK(axis >= 0 && axis < rank() && part.rank() == rank());
  const int64_t rows = part.dim(axis);
  CHECK(begin >= 0 && begin + rows <= shape_[axis]);
  for (int i = 0; i < rank(); ++i) CHECK(i == axis || part.dim(i) == dim(i)) << "AssignSlice dim " << i;
  int64_t outer, inner;
  OuterInner(shape_, axis, &outer, &inner);
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(data() + (o * shape_[axis] + begin) * inner, part.data() + o * rows * inner,
                rows * inner * sizeof(float));
  }
}

Tensor Tensor::Concat(const std::vector<Tensor>& parts, int axis) {
  CHECK(!parts.empty());
  Shape shape = parts[0].shape();
  int64_t total = 0;
  for (const Tensor& p : parts) total += p.dim(axis);
  shape[axis] = total;
  Tensor out(shape);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    out.AssignSlice(axis, at, p);
    at += p.dim(axis);
  }
  return out;
}

void Tensor::Fill(float v) { std::fill(data_.begin(), data_.end(), v); }

}  // namespace psflow
