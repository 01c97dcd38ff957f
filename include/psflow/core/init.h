// psflow/core/init.h — variable initializers (TensorFlow semantics).
#ifndef PSFLOW_CORE_INIT_H_
#define PSFLOW_CORE_INIT_H_

#include "psflow/core/random.h"
#include "psflow/core/tensor.h"

namespace psflow::init {

// Normal(0, stddev) with values beyond 2 stddev redrawn (tf.truncated_normal).
Tensor TruncatedNormal(const Shape& shape, float stddev, Rng& rng);
Tensor Zeros(const Shape& shape);
Tensor Constant(const Shape& shape, float value);
// Uniform(-l, l), l = sqrt(6 / (fan_in + fan_out)); for conv filters [kh,kw,in,out] the fans
// are kh*kw*in and kh*kw*out (tf.glorot_uniform_initializer).
Tensor GlorotUniform(const Shape& shape, Rng& rng);

}  // namespace psflow::init

#endif  // PSFLOW_CORE_INIT_H_
