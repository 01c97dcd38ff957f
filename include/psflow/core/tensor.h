// psflow/core/tensor.h — a dense float32 tensor: a shape and a contiguous row-major buffer.
//
// A Tensor owns its buffer (value semantics: copying a Tensor copies the data; moving is cheap).
// The buffer is 64-byte aligned so BLAS/oneDNN kernels and the wire coding can use it directly.
// Not thread-safe for concurrent mutation; concurrent reads are fine.
#ifndef PSFLOW_CORE_TENSOR_H_
#define PSFLOW_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

namespace psflow {

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar, i.e. an empty shape).
int64_t NumElements(const Shape& shape);
// "[2,3,4]" — used in error messages and placement listings.
std::string ShapeToString(const Shape& shape);

namespace internal {
// 64-byte aligned blocks. Large blocks are recycled by exact size (thread-safe, bounded): a
// training step frees and re-allocates the same large activation and gradient buffers every
// step, and handing them back to the kernel (glibc unmaps or trims big blocks) would page-fault
// them in again each step, which costs more than 10% of a CNN step.
void* AllocateAlignedBlock(std::size_t bytes);
void FreeAlignedBlock(void* p, std::size_t bytes);
// Hands every cached block back to the system: after a one-off burst of big tensors (a
// checkpoint's snapshot) whose blocks would otherwise stay cached beside later allocations of
// other sizes, raising the peak by up to the cache's bound.
void ReleaseCachedBlocks();
}  // namespace internal

// Allocator handing out 64-byte aligned storage (cache lines, AVX-512 loads).
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(internal::AllocateAlignedBlock(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) { internal::FreeAlignedBlock(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

using FloatBuffer = std::vector<float, AlignedAllocator<float>>;

// AlignedAllocator whose value-initialising construct() leaves floats uninitialised, so that
// Tensor::Uninitialized can skip the memset of buffers a kernel overwrites anyway. Explicit
// fills (Tensor(shape), Tensor(shape, fill)) still initialise.
template <typename T>
struct UninitAlignedAllocator : AlignedAllocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = UninitAlignedAllocator<U>;
  };
  UninitAlignedAllocator() = default;
  template <typename U>
  UninitAlignedAllocator(const UninitAlignedAllocator<U>&) {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(static_cast<Args&&>(args)...);
  }
};

class Tensor {
 public:
  Tensor() = default;  // an empty tensor: shape {0}, no data
  // Zero-filled tensor of the given shape.
  explicit Tensor(Shape shape);
  Tensor(Shape shape, float fill);
  // Takes the values; values.size() must equal NumElements(shape) (CHECKed: programmer error).
  Tensor(Shape shape, std::vector<float> values);

  static Tensor Scalar(float v) { return Tensor(Shape{}, v); }
  // A tensor whose contents are unspecified: for kernels that overwrite every element.
  static Tensor Uninitialized(Shape shape);

  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const { return shape_[static_cast<size_t>(axis)]; }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }
  size_t bytes() const { return data_.size() * sizeof(float); }
  bool empty() const { return data_.empty(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> span() { return {data_.data(), data_.size()}; }
  std::span<const float> span() const { return {data_.data(), data_.size()}; }
  float& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }

  // Same data viewed with another shape of equal element count (CHECKed).
  Tensor Reshaped(Shape shape) const;
  void Reshape(Shape shape);

  // Copy of rows [begin, end) along `axis` (the partitioners split variables this way).
  Tensor Slice(int axis, int64_t begin, int64_t end) const;
  // Writes `part` into rows [begin, begin + part.dim(axis)) along `axis`; other dims must match.
  void AssignSlice(int axis, int64_t begin, const Tensor& part);
  // Concatenation along `axis`; all other dims must match.
  static Tensor Concat(const std::vector<Tensor>& parts, int axis);

  void Fill(float v);
  void SetZero() { Fill(0.0f); }

 private:
  Shape shape_{0};
  std::vector<float, UninitAlignedAllocator<float>> data_;
};

}  // namespace psflow

#endif  // PSFLOW_CORE_TENSOR_H_
