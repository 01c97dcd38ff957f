#include "psflow/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "psflow/core/check.h"

namespace psflow {

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

Tensor::Tensor(Shape shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(values.begin(), values.end()) {
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
