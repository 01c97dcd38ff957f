// The update rules' arithmetic (update_kernels.h), written as TensorFlow's ApplyGradientDescent /
// ApplyMomentum / ApplyAdagrad / ApplyFtrl / ApplyAdam / ApplyRMSProp kernels compute them, or as
// torch.optim's single-tensor Adagrad / Adam / RMSprop do (the same operations in the same order, so
// both round alike). Each rule is one row loop (Rule<K>::Loop, called as RowLoop<K>) over __restrict
// pointers — GCC honours restrict on parameters, not on local pointers, so the loops vectorize
// without a run-time aliasing check — with its scalars hoisted into locals first; the gradient is
// read through Load, from floats or from bytes at any address. The three dispatched entry points
// inline every rule's loop into a clone per ISA (core/simd_dispatch.h; this library is built with
// -ffp-contract=off, so every clone rounds the same way).
#include "optim/update_kernels.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/simd_dispatch.h"

namespace psflow::optim::kernels {
namespace {

// Gradient element i: from a float array, or from floats stored at any byte address (a received
// message's bytes read in place; the 4-byte memcpy compiles to an unaligned vector load). Only the
// load differs, not the arithmetic: both give the same bits.
[[gnu::always_inline]] inline float Load(const float* __restrict g, int64_t i) { return g[i]; }
[[gnu::always_inline]] inline float Load(const char* __restrict g, int64_t i) {
  float v;
  std::memcpy(&v, g + 4 * i, sizeof(v));
  return v;
}

// One rule over n floats: weights w, slots s0 and s1 (unused ones ignored), gradient g (G is float,
// or char for floats at any address). Rule<K>::Loop, one specialization per kernel.
template <Kernel K>
struct Rule;

template <>
struct Rule<Kernel::kSgd> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict, float* __restrict,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr;
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * Load(g, i);
  }
};

template <>
struct Rule<Kernel::kMomentum> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict a, float* __restrict,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr, mu = s.mu;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      a[i] = a[i] * mu + gi;
      w[i] -= a[i] * lr;
    }
  }
};

template <>
struct Rule<Kernel::kNesterov> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict a, float* __restrict,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr, mu = s.mu;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      a[i] = a[i] * mu + gi;
      w[i] -= (gi + a[i] * mu) * lr;
    }
  }
};

template <>
struct Rule<Kernel::kAdagrad> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict acc, float* __restrict,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      acc[i] += gi * gi;
      w[i] -= gi * lr / std::sqrt(acc[i]);
    }
  }
};

// torch.optim.Adagrad (lr_decay 0).
template <>
struct Rule<Kernel::kTorchAdagrad> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict acc, float* __restrict,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr, eps = s.eps;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      acc[i] += gi * gi;
      w[i] -= lr * (gi / (std::sqrt(acc[i]) + eps));
    }
  }
};

// n' = n + g²; z += g − (√n' − √n)/lr·w; n = n'; w = (sign(z)·l1 − z)/(√n/lr + 2·l2) if |z| > l1 else 0.
template <>
struct Rule<Kernel::kFtrl> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict acc, float* __restrict z,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float inv_lr = 1.0f / s.lr, l1 = s.l1, l2 = s.l2;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      const float acc_new = acc[i] + gi * gi;
      const float sqrt_new = std::sqrt(acc_new);
      z[i] += gi - (sqrt_new - std::sqrt(acc[i])) * inv_lr * w[i];
      acc[i] = acc_new;
      const float quadratic = sqrt_new * inv_lr + 2.0f * l2;
      const float sign = z[i] < 0.0f ? -1.0f : 1.0f;
      w[i] = std::abs(z[i]) > l1 ? (sign * l1 - z[i]) / quadratic : 0.0f;
    }
  }
};

template <>
struct Rule<Kernel::kAdam> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict m, float* __restrict v,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float alpha = s.lr, one_minus_beta1 = s.one_minus_beta1, one_minus_beta2 = s.one_minus_beta2, eps = s.eps;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      m[i] += (gi - m[i]) * one_minus_beta1;
      v[i] += (gi * gi - v[i]) * one_minus_beta2;
      w[i] -= (m[i] * alpha) / (std::sqrt(v[i]) + eps);
    }
  }
};

// torch.optim.Adam: m.lerp_(g, 1 - b1); v = v * b2 + (1 - b2) g g;
// w -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps), step_size = lr / (1 - b1^t).
template <>
struct Rule<Kernel::kTorchAdam> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict m, float* __restrict v,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float step_size = s.lr, bc2_sqrt = s.bc2_sqrt, one_minus_beta1 = s.one_minus_beta1, beta2 = s.beta2,
                one_minus_beta2 = s.one_minus_beta2, eps = s.eps;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      m[i] += one_minus_beta1 * (gi - m[i]);
      v[i] = v[i] * beta2 + one_minus_beta2 * gi * gi;
      w[i] -= step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps));
    }
  }
};

template <>
struct Rule<Kernel::kRmsProp> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict ms, float* __restrict mom,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr, one_minus_rho = s.one_minus_rho, mu = s.mu, eps = s.eps;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      ms[i] += (gi * gi - ms[i]) * one_minus_rho;
      mom[i] = mom[i] * mu + (gi * lr) / std::sqrt(ms[i] + eps);
      w[i] -= mom[i];
    }
  }
};

// torch.optim.RMSprop (centered False): with mu 0 this is torch's w -= lr * g / (sqrt(ms) + eps).
template <>
struct Rule<Kernel::kTorchRmsProp> {
  template <typename G>
  [[gnu::always_inline]] static void Loop(float* __restrict w, float* __restrict ms, float* __restrict mom,
                                          const G* __restrict g, int64_t n, Scalars s) {
    const float lr = s.lr, alpha = s.rho, one_minus_alpha = s.one_minus_rho, mu = s.mu, eps = s.eps;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = Load(g, i);
      ms[i] = ms[i] * alpha + one_minus_alpha * gi * gi;
      mom[i] = mom[i] * mu + gi / (std::sqrt(ms[i]) + eps);
      w[i] -= lr * mom[i];
    }
  }
};

template <Kernel K, typename G>
[[gnu::always_inline]] inline void RowLoop(float* __restrict w, float* __restrict s0, float* __restrict s1,
                                           const G* __restrict g, int64_t n, Scalars s) {
  Rule<K>::template Loop<G>(w, s0, s1, g, n, s);
}

constexpr int SlotCount(Kernel k) {
  switch (k) {
    case Kernel::kSgd:
      return 0;
    case Kernel::kMomentum:
    case Kernel::kNesterov:
    case Kernel::kAdagrad:
    case Kernel::kTorchAdagrad:
      return 1;
    case Kernel::kFtrl:
    case Kernel::kAdam:
    case Kernel::kTorchAdam:
    case Kernel::kRmsProp:
    case Kernel::kTorchRmsProp:
      return 2;
  }
  return 0;
}

// The rows of one push under rule K; the records kRowsAhead rows on are prefetched.
constexpr int64_t kRowsAhead = 4;

inline __attribute__((always_inline)) void PrefetchRecord(float* const* recs, int64_t r, int64_t n,
                                                          int64_t record_bytes) {
  if (r >= n || recs[r] == nullptr) return;
  const char* p = reinterpret_cast<const char*>(recs[r]);
  for (int64_t b = 0; b < record_bytes; b += 64) __builtin_prefetch(p + b, 1);
}

template <Kernel K, bool kRowLr>
[[gnu::always_inline]] inline void RowsLoop(Scalars s, float* const* recs, const float* g, const float* row_lr,
                                            int64_t n, int64_t dim) {
  constexpr int kSlots = SlotCount(K);
  const int64_t record_bytes = dim * static_cast<int64_t>(sizeof(float)) * (1 + kSlots);
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, record_bytes);
    float* rec = recs[r];
    if (rec == nullptr) continue;
    if constexpr (kRowLr) s.lr = row_lr[r];
    RowLoop<K>(rec, kSlots >= 1 ? rec + dim : nullptr, kSlots >= 2 ? rec + 2 * dim : nullptr, g + r * dim, dim, s);
  }
}

template <Kernel K>
[[gnu::always_inline]] inline void Rows(const Scalars& s, float* const* recs, const float* g, const float* row_lr,
                                        int64_t n, int64_t dim) {
  if (row_lr != nullptr) return RowsLoop<K, true>(s, recs, g, row_lr, n, dim);
  RowsLoop<K, false>(s, recs, g, nullptr, n, dim);
}

// 1 - x computed in double then rounded, as torch turns the Python float (1 - beta) into the op's
// float scalar (1.0f - 0.999f would be 1.3e-5 off).
float OneMinus(float x) { return static_cast<float>(1.0 - static_cast<double>(x)); }

bool Torch(const OptimizerConfig& c) { return c.convention == "torch"; }

}  // namespace

Kernel KernelFor(const OptimizerConfig& c) {
  const std::string& name = c.name;
  if (name == "sgd") return Kernel::kSgd;
  if (name == "momentum") return c.nesterov ? Kernel::kNesterov : Kernel::kMomentum;
  if (name == "adagrad") return Torch(c) ? Kernel::kTorchAdagrad : Kernel::kAdagrad;
  if (name == "ftrl") return Kernel::kFtrl;
  if (name == "adam" || name == "adamw") return Torch(c) ? Kernel::kTorchAdam : Kernel::kAdam;
  if (name == "rmsprop") return Torch(c) ? Kernel::kTorchRmsProp : Kernel::kRmsProp;
  CHECK(false) << "no update kernel for optimizer '" << name << "' (the config was not validated)";
  return Kernel::kSgd;
}

const std::vector<std::string>& SlotNames(Kernel k) {
  static const auto* const kNone = new std::vector<std::string>{};
  static const auto* const kMomentum = new std::vector<std::string>{"momentum"};
  static const auto* const kAccumulator = new std::vector<std::string>{"accumulator"};
  static const auto* const kFtrl = new std::vector<std::string>{"accumulator", "linear"};
  static const auto* const kAdam = new std::vector<std::string>{"m", "v"};
  static const auto* const kRmsProp = new std::vector<std::string>{"ms", "mom"};
  switch (k) {
    case Kernel::kSgd:
      return *kNone;
    case Kernel::kMomentum:
    case Kernel::kNesterov:
      return *kMomentum;
    case Kernel::kAdagrad:
    case Kernel::kTorchAdagrad:
      return *kAccumulator;
    case Kernel::kFtrl:
      return *kFtrl;
    case Kernel::kAdam:
    case Kernel::kTorchAdam:
      return *kAdam;
    case Kernel::kRmsProp:
    case Kernel::kTorchRmsProp:
      return *kRmsProp;
  }
  return *kNone;
}

float SlotInitialValue(Kernel k, const OptimizerConfig& c, int slot) {
  switch (k) {
    case Kernel::kAdagrad:
    case Kernel::kTorchAdagrad:
    case Kernel::kFtrl:
      return slot == 0 ? c.initial_accumulator : 0.0f;  // ftrl's linear slot starts at 0
    case Kernel::kRmsProp:
      return slot == 0 ? 1.0f : 0.0f;  // TF's ms starts at 1 (torch's at 0)
    default:
      return 0.0f;
  }
}

float AdamStepSize(const OptimizerConfig& c, float lr, int64_t t) {
  const double td = static_cast<double>(t);
  return static_cast<float>(lr * std::sqrt(1.0 - std::pow(static_cast<double>(c.beta2), td)) /
                            (1.0 - std::pow(static_cast<double>(c.beta1), td)));
}

Scalars Prepare(Kernel k, const OptimizerConfig& c, float lr, int64_t t, float ftrl_l1, float ftrl_l2) {
  Scalars s;
  s.lr = lr;
  switch (k) {
    case Kernel::kSgd:
    case Kernel::kAdagrad:
      break;
    case Kernel::kMomentum:
    case Kernel::kNesterov:
      s.mu = c.momentum;
      break;
    case Kernel::kTorchAdagrad:
      s.eps = c.adagrad_epsilon;
      break;
    case Kernel::kFtrl:
      s.l1 = ftrl_l1;
      s.l2 = ftrl_l2;
      break;
    case Kernel::kAdam:
      s.lr = AdamStepSize(c, lr, t);
      s.one_minus_beta1 = 1.0f - c.beta1;
      s.one_minus_beta2 = 1.0f - c.beta2;
      s.eps = c.adam_epsilon;
      break;
    case Kernel::kTorchAdam: {
      const double td = static_cast<double>(t);
      const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), td);
      const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), td);
      s.lr = static_cast<float>(lr / bc1);
      s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
      s.one_minus_beta1 = OneMinus(c.beta1);
      s.beta2 = c.beta2;
      s.one_minus_beta2 = OneMinus(c.beta2);
      s.eps = c.adam_epsilon;
      break;
    }
    case Kernel::kRmsProp:
      s.one_minus_rho = 1.0f - c.rms_decay;
      s.mu = c.rms_momentum;
      s.eps = c.rms_epsilon;
      break;
    case Kernel::kTorchRmsProp:
      s.rho = c.rms_decay;
      s.one_minus_rho = OneMinus(c.rms_decay);
      s.mu = c.rms_momentum;
      s.eps = c.rms_epsilon;
      break;
  }
  return s;
}

namespace {

// One case per kernel: each inlines that rule's loop into the ISA clone that calls it.
template <typename G>
[[gnu::always_inline]] inline void Slice(Kernel kernel, const Scalars& scalars, float* w, float* s0, float* s1,
                                         const G* g, int64_t n) {
  switch (kernel) {
    case Kernel::kSgd:
      return RowLoop<Kernel::kSgd>(w, s0, s1, g, n, scalars);
    case Kernel::kMomentum:
      return RowLoop<Kernel::kMomentum>(w, s0, s1, g, n, scalars);
    case Kernel::kNesterov:
      return RowLoop<Kernel::kNesterov>(w, s0, s1, g, n, scalars);
    case Kernel::kAdagrad:
      return RowLoop<Kernel::kAdagrad>(w, s0, s1, g, n, scalars);
    case Kernel::kTorchAdagrad:
      return RowLoop<Kernel::kTorchAdagrad>(w, s0, s1, g, n, scalars);
    case Kernel::kFtrl:
      return RowLoop<Kernel::kFtrl>(w, s0, s1, g, n, scalars);
    case Kernel::kAdam:
      return RowLoop<Kernel::kAdam>(w, s0, s1, g, n, scalars);
    case Kernel::kTorchAdam:
      return RowLoop<Kernel::kTorchAdam>(w, s0, s1, g, n, scalars);
    case Kernel::kRmsProp:
      return RowLoop<Kernel::kRmsProp>(w, s0, s1, g, n, scalars);
    case Kernel::kTorchRmsProp:
      return RowLoop<Kernel::kTorchRmsProp>(w, s0, s1, g, n, scalars);
  }
}

}  // namespace

PSFLOW_DISPATCH void ApplySlice(Kernel kernel, const Scalars& scalars, float* w, float* s0, float* s1, const float* g,
                                int64_t n) {
  Slice(kernel, scalars, w, s0, s1, g, n);
}

PSFLOW_DISPATCH void ApplySliceFromBytes(Kernel kernel, const Scalars& scalars, float* w, float* s0, float* s1,
                                         const void* g, int64_t n) {
  Slice(kernel, scalars, w, s0, s1, static_cast<const char*>(g), n);
}

PSFLOW_DISPATCH void ApplyRows(Kernel kernel, const Scalars& scalars, float* const* records, const float* grads,
                               const float* row_lr, int64_t n, int64_t dim) {
  switch (kernel) {
    case Kernel::kSgd:
      return Rows<Kernel::kSgd>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kMomentum:
      return Rows<Kernel::kMomentum>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kNesterov:
      return Rows<Kernel::kNesterov>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kAdagrad:
      return Rows<Kernel::kAdagrad>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kTorchAdagrad:
      return Rows<Kernel::kTorchAdagrad>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kFtrl:
      return Rows<Kernel::kFtrl>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kAdam:
      return Rows<Kernel::kAdam>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kTorchAdam:
      return Rows<Kernel::kTorchAdam>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kRmsProp:
      return Rows<Kernel::kRmsProp>(scalars, records, grads, row_lr, n, dim);
    case Kernel::kTorchRmsProp:
      return Rows<Kernel::kTorchRmsProp>(scalars, records, grads, row_lr, n, dim);
  }
}

}  // namespace psflow::optim::kernels
