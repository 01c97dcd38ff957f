// MaxPool and Dropout. MaxPool is hand-written: a window max over NHWC is a few lines, runs at
// memory speed, and keeps TensorFlow's exact SAME semantics (padded cells never win).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/simd_dispatch.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow::ops {

Var MaxPool(const Var& x, int kh, int kw, int stride_h, int stride_w, Padding padding) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& xv = x->value;
  CHECK(xv.rank() == 4) << "MaxPool needs x [n,h,w,c], got " << ShapeToString(xv.shape());
  const int64_t batch = xv.dim(0), in_h = xv.dim(1), in_w = xv.dim(2), channels = xv.dim(3);
  int64_t out_h, out_w, pad_top, pad_left, unused;
  internal::TfPadding(in_h, kh, stride_h, padding, &out_h, &pad_top, &unused);
  internal::TfPadding(in_w, kw, stride_w, padding, &out_w, &pad_left, &unused);
  const int64_t in_image = in_h * in_w * channels;
  const int64_t out_image = out_h * out_w * channels;

  Tensor out = Tensor::Uninitialized({batch, out_h, out_w, channels});
  // For each output element, the offset within its input image of the (first) max.
  std::vector<int32_t> argmax(batch * out_image);
  const float* in = xv.data();
  ParallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* image = in + b * in_image;
      for (int64_t oy = 0; oy < out_h; ++oy) {
        const int64_t y0 = std::max<int64_t>(oy * stride_h - pad_top, 0);
        const int64_t y1 = std::min<int64_t>(oy * stride_h - pad_top + kh, in_h);
        for (int64_t ox = 0; ox < out_w; ++ox) {
          const int64_t x0 = std::max<int64_t>(ox * stride_w - pad_left, 0);
          const int64_t x1 = std::min<int64_t>(ox * stride_w - pad_left + kw, in_w);
          float* best = out.data() + b * out_image + (oy * out_w + ox) * channels;
          int32_t* arg = argmax.data() + b * out_image + (oy * out_w + ox) * channels;
          // Only cells inside the image take part; the first one seeds the max.
          const int32_t first = static_cast<int32_t>((y0 * in_w + x0) * channels);
          std::memcpy(best, image + first, channels * sizeof(float));
          for (int64_t c = 0; c < channels; ++c) arg[c] = first + static_cast<int32_t>(c);
          for (int64_t iy = y0; iy < y1; ++iy) {
            for (int64_t ix = x0; ix < x1; ++ix) {
              const int32_t offset = static_cast<int32_t>((iy * in_w + ix) * channels);
              // Strict: ties keep the first max in scan order (vector-dispatched, simd_dispatch.h).
              simd::MaxInto(best, arg, image + offset, offset, channels);
            }
          }
        }
      }
    }
  });
  return MakeOpNode("MaxPool", std::move(out), {x},
                    [argmax = std::move(argmax), batch, in_image, out_image](Node& self) {
                      Node& nx = *self.inputs[0];
                      Tensor dx = Tensor::Uninitialized(nx.value.shape());
                      const float* g = self.grad.data();
                      ParallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
                        for (int64_t b = b0; b < b1; ++b) {
                          // Zeroed per image, so the scatter below hits cache.
                          float* d = dx.data() + b * in_image;
                          std::fill(d, d + in_image, 0.0f);
                          const int32_t* arg = argmax.data() + b * out_image;
                          const float* gb = g + b * out_image;
                          for (int64_t i = 0; i < out_image; ++i) d[arg[i]] += gb[i];
                        }
                      });
                      nx.AccumulateGrad(std::move(dx));
                    });
}

Var Dropout(const Var& x, float rate, bool training, Rng& rng) {
  psflow::internal::PrepareThreadForKernels();
  CHECK(rate >= 0.0f && rate < 1.0f) << "Dropout rate " << rate << " outside [0, 1)";
  if (!training || rate == 0.0f) {
    return MakeOpNode("Dropout", x->value, {x},
                      [](Node& self) { self.inputs[0]->AccumulateGrad(std::move(self.grad)); });
  }
  const float scale = 1.0f / (1.0f - rate);
  const int64_t n = x->value.size();
  // mask is 0 for dropped elements and 1/(1-rate) for kept ones; drawn sequentially so that a
  // seed fixes it whatever the thread count.
  Tensor mask = Tensor::Uninitialized(x->value.shape());
  for (int64_t i = 0; i < n; ++i) mask[i] = rng.Uniform() >= rate ? scale : 0.0f;
  Tensor out = Tensor::Uninitialized(x->value.shape());
  const float* xp = x->value.data();
  const float* mp = mask.data();
  float* op = out.data();
  ParallelFor(n, internal::kMinElementsPerBlock, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) op[i] = xp[i] * mp[i];
  });
  return MakeOpNode("Dropout", std::move(out), {x}, [mask = std::move(mask)](Node& self) {
    float* g = self.grad.data();
    const float* mp = mask.data();
    ParallelFor(self.grad.size(), internal::kMinElementsPerBlock, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) g[i] *= mp[i];
    });
    self.inputs[0]->AccumulateGrad(std::move(self.grad));
  });
}

}  // namespace psflow::ops
