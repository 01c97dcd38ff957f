// Fallback convolution kernels: im2col + OpenBLAS sgemm, one image at a time. Used only when
// oneDNN declines a geometry; NHWC/HWIO make the column matrix [out pixels, kh*kw*c] multiply the
// filter [kh*kw*c, oc] directly.
#include <algorithm>
#include <cstring>

#include "core/ops_internal.h"
#include "psflow/core/tensor.h"

namespace psflow::ops::internal {
namespace {

int64_t PatchSize(const ConvGeometry& g) { return g.k_h * g.k_w * g.in_c; }

// col[p, (ky*kw + kx)*c + ci] = x[iy, ix, ci] for output pixel p, zero where padded.
void Im2Col(const ConvGeometry& g, const float* image, float* col) {
  const int64_t patch = PatchSize(g);
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    for (int64_t ox = 0; ox < g.out_w; ++ox) {
      float* dst = col + (oy * g.out_w + ox) * patch;
      for (int64_t ky = 0; ky < g.k_h; ++ky) {
        const int64_t iy = oy * g.stride_h - g.pad_top + ky;
        for (int64_t kx = 0; kx < g.k_w; ++kx) {
          const int64_t ix = ox * g.stride_w - g.pad_left + kx;
          float* cell = dst + (ky * g.k_w + kx) * g.in_c;
          if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) {
            std::fill(cell, cell + g.in_c, 0.0f);
          } else {
            std::memcpy(cell, image + (iy * g.in_w + ix) * g.in_c, g.in_c * sizeof(float));
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds col's entries back into the image (which must be zeroed first).
void Col2ImAdd(const ConvGeometry& g, const float* col, float* image) {
  const int64_t patch = PatchSize(g);
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    for (int64_t ox = 0; ox < g.out_w; ++ox) {
      const float* src = col + (oy * g.out_w + ox) * patch;
      for (int64_t ky = 0; ky < g.k_h; ++ky) {
        const int64_t iy = oy * g.stride_h - g.pad_top + ky;
        if (iy < 0 || iy >= g.in_h) continue;
        for (int64_t kx = 0; kx < g.k_w; ++kx) {
          const int64_t ix = ox * g.stride_w - g.pad_left + kx;
          if (ix < 0 || ix >= g.in_w) continue;
          const float* cell = src + (ky * g.k_w + kx) * g.in_c;
          float* dst = image + (iy * g.in_w + ix) * g.in_c;
          for (int64_t c = 0; c < g.in_c; ++c) dst[c] += cell[c];
        }
      }
    }
  }
}

}  // namespace

void Im2ColConvForward(const ConvGeometry& g, const float* x, const float* filter, const float* bias, bool relu,
                       float* out) {
  const int64_t pixels = g.out_h * g.out_w;
  Tensor col = Tensor::Uninitialized({pixels, PatchSize(g)});
  for (int64_t b = 0; b < g.batch; ++b) {
    Im2Col(g, x + b * g.in_h * g.in_w * g.in_c, col.data());
    Gemm(false, false, pixels, g.out_c, PatchSize(g), col.data(), filter, out + b * pixels * g.out_c, false);
  }
  if (bias != nullptr) AddBiasAndActivate(out, bias, g.batch * pixels, g.out_c, relu);
}

void Im2ColConvBackwardData(const ConvGeometry& g, const float* d_out, const float* filter, float* d_x) {
  const int64_t pixels = g.out_h * g.out_w;
  const int64_t image_size = g.in_h * g.in_w * g.in_c;
  Tensor col = Tensor::Uninitialized({pixels, PatchSize(g)});
  std::fill(d_x, d_x + g.batch * image_size, 0.0f);
  for (int64_t b = 0; b < g.batch; ++b) {
    Gemm(false, true, pixels, PatchSize(g), g.out_c, d_out + b * pixels * g.out_c, filter, col.data(), false);
    Col2ImAdd(g, col.data(), d_x + b * image_size);
  }
}

void Im2ColConvBackwardFilter(const ConvGeometry& g, const float* x, const float* d_out, float* d_filter) {
  const int64_t pixels = g.out_h * g.out_w;
  Tensor col = Tensor::Uninitialized({pixels, PatchSize(g)});
  std::fill(d_filter, d_filter + PatchSize(g) * g.out_c, 0.0f);
  for (int64_t b = 0; b < g.batch; ++b) {
    Im2Col(g, x + b * g.in_h * g.in_w * g.in_c, col.data());
    Gemm(true, false, PatchSize(g), g.out_c, pixels, col.data(), d_out + b * pixels * g.out_c, d_filter, true);
  }
}

}  // namespace psflow::ops::internal
