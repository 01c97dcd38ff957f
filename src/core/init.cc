#include "psflow/core/init.h"

#include <algorithm>
#include <cmath>

namespace psflow::init {

Tensor TruncatedNormal(const Shape& shape, float stddev, Rng& rng) {
  Tensor t(shape);
  for (float& v : t.span()) {
    double z;
    do {
      z = rng.Normal();
    } while (std::abs(z) > 2.0);
    v = static_cast<float>(z * stddev);
  }
  return t;
}

Tensor Zeros(const Shape& shape) { return Tensor(shape); }

Tensor Constant(const Shape& shape, float value) { return Tensor(shape, value); }

Tensor GlorotUniform(const Shape& shape, Rng& rng) {
  // Fans as tf.keras.initializers computes them (_compute_fans).
  double fan_in = 1, fan_out = 1;
  if (shape.size() == 1) {
    fan_in = fan_out = static_cast<double>(shape[0]);
  } else if (shape.size() == 2) {
    fan_in = static_cast<double>(shape[0]);
    fan_out = static_cast<double>(shape[1]);
  } else if (shape.size() > 2) {
    double receptive = 1;
    for (size_t i = 0; i + 2 < shape.size(); ++i) receptive *= static_cast<double>(shape[i]);
    fan_in = static_cast<double>(shape[shape.size() - 2]) * receptive;
    fan_out = static_cast<double>(shape.back()) * receptive;
  }
  const float limit = static_cast<float>(std::sqrt(6.0 / std::max(1.0, fan_in + fan_out)));
  Tensor t(shape);
  for (float& v : t.span()) v = limit * (2.0f * rng.Uniform() - 1.0f);
  return t;
}

}  // namespace psflow::init
