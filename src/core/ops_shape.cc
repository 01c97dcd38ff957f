// Shape ops: Reshape, Flatten, Concat and Split. Reshape shares nothing with its input but the
// values (a copy, as Tensors own their buffers); Concat and Split copy blocks of `inner` floats,
// where a shape is seen as [outer, dim(axis), inner] around the axis.
#include <cstring>
#include <vector>

#include "core/check.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace {

// The shape as [outer, dim(axis), inner].
void OuterInner(const Shape& shape, int axis, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < axis; ++i) *outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) *inner *= shape[i];
}

int ResolveAxis(const char* op, int axis, int rank) {
  const int resolved = axis < 0 ? axis + rank : axis;
  CHECK(resolved >= 0 && resolved < rank) << op << ": axis " << axis << " outside a rank-" << rank << " tensor";
  return resolved;
}

}  // namespace

Var Reshape(const Var& x, Shape shape) {
  int64_t known = 1;
  int infer_axis = -1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      CHECK_EQ(infer_axis, -1) << "Reshape: at most one -1 in " << ShapeToString(shape);
      infer_axis = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer_axis >= 0) {
    CHECK(known > 0 && x->value.size() % known == 0)
        << "Reshape " << ShapeToString(x->value.shape()) << " to " << ShapeToString(shape);
    shape[infer_axis] = x->value.size() / known;
  }
  return MakeOpNode("Reshape", x->value.Reshaped(std::move(shape)), {x},
                    [](Node& self) { self.inputs[0]->AccumulateGrad(std::move(self.grad)); });
}

Var Flatten(const Var& x) {
  CHECK(x->value.rank() >= 1) << "Flatten of a scalar";
  const int64_t n = x->value.dim(0);
  return Reshape(x, {n, n == 0 ? 0 : x->value.size() / n});
}

Var Concat(const std::vector<Var>& parts, int axis) {
  CHECK(!parts.empty()) << "Concat of no parts";
  const Shape& first = parts[0]->value.shape();
  axis = ResolveAxis("Concat", axis, static_cast<int>(first.size()));
  Shape shape = first;
  shape[axis] = 0;
  std::vector<int64_t> sizes;
  for (const Var& p : parts) {
    const Shape& s = p->value.shape();
    bool match = s.size() == first.size();
    for (size_t i = 0; match && i < s.size(); ++i) match = static_cast<int>(i) == axis || s[i] == first[i];
    CHECK(match) << "Concat along axis " << axis << ": part " << ShapeToString(s) << " does not match "
                 << ShapeToString(first);
    sizes.push_back(s[axis]);
    shape[axis] += s[axis];
  }
  int64_t outer, inner;
  OuterInner(shape, axis, &outer, &inner);
  const int64_t total = shape[axis];
  Tensor out = Tensor::Uninitialized(shape);
  int64_t at = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const float* src = parts[k]->value.data();
    const int64_t block = sizes[k] * inner;
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(out.data() + (o * total + at) * inner, src + o * block, static_cast<size_t>(block) * sizeof(float));
    }
    at += sizes[k];
  }
  return MakeOpNode("Concat", std::move(out), parts, [axis, sizes = std::move(sizes)](Node& self) {
    int64_t at = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      Node& part = *self.inputs[k];
      if (part.requires_grad) part.AccumulateGrad(self.grad.Slice(axis, at, at + sizes[k]));
      at += sizes[k];
    }
  });
}

std::vector<Var> Split(const Var& x, int axis, std::span<const int64_t> sizes) {
  const Shape& shape = x->value.shape();
  axis = ResolveAxis("Split", axis, static_cast<int>(shape.size()));
  int64_t sum = 0;
  for (int64_t s : sizes) {
    CHECK(s >= 0) << "Split: negative size " << s;
    sum += s;
  }
  CHECK_EQ(sum, shape[axis]) << "Split: sizes add up to " << sum << ", dim " << axis << " of " << ShapeToString(shape)
                             << " is " << shape[axis];
  int64_t outer, inner;
  OuterInner(shape, axis, &outer, &inner);
  const int64_t total = shape[axis];
  std::vector<Var> out;
  int64_t at = 0;
  for (int64_t size : sizes) {
    // Each part adds its gradient into its block of x's (zero-filled) gradient.
    out.push_back(MakeOpNode("Split", x->value.Slice(axis, at, at + size), {x}, [=](Node& self) {
      float* dst = self.inputs[0]->MutableGrad().data();
      const float* src = self.grad.data();
      const int64_t block = size * inner;
      for (int64_t o = 0; o < outer; ++o) {
        float* d = dst + (o * total + at) * inner;
        const float* s = src + o * block;
        for (int64_t i = 0; i < block; ++i) d[i] += s[i];
      }
    }));
    at += size;
  }
  return out;
}

}  // namespace psflow::ops
