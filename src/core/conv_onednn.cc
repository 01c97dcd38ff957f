// Convolution kernels on oneDNN. Why oneDNN: its JIT direct convolutions (AVX2 / AVX-512
// "jit" and "brgconv" kernels) are far faster than im2col + sgemm for the small-channel convs of
// CNNs, and it is the library PyTorch itself uses for CPU convolution, so psflow competes on
// equal kernels. Activations stay NHWC (oneDNN's nhwc kernels are as fast as its blocked ones
// here, and avoid reordering the big tensors); only the small filter is reordered between HWIO
// and the layout oneDNN prefers ("any"). Primitives are built once per geometry and cached.
#include <array>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/ops_internal.h"
#include "psflow/core/tensor.h"

namespace psflow::ops::internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A stream is not meant to be shared between threads; one per thread, on the one engine.
dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

// Scratch memory handed to primitives (scratchpad_mode::user), so that one cached primitive can
// run concurrently on several threads (replicas) without sharing oneDNN's internal scratchpad.
float* Scratch(const memory::desc& desc) {
  thread_local FloatBuffer buffer;
  const size_t floats = desc.get_size() / sizeof(float) + 1;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

// A reorder between two layouts of the same tensor, or nothing when the layouts are equal.
struct Reorder {
  std::optional<dnnl::reorder::primitive_desc> pd;
  std::optional<dnnl::reorder> primitive;
  memory::desc from, to;
};

struct ConvPrimitives {
  memory::desc src, dst, user_weights, bias;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  Reorder weights_to_fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  Reorder weights_to_bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_filter_pd;
  dnnl::convolution_backward_weights bwd_filter;
  Reorder filter_grad_to_user;
};

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

Reorder MakeReorder(const memory::desc& from, const memory::desc& to) {
  Reorder r{std::nullopt, std::nullopt, from, to};
  if (from != to) {
    r.pd.emplace(Engine(), from, Engine(), to, UserScratchpad());
    r.primitive.emplace(*r.pd);
  }
  return r;
}

// What the forward primitive adds after the convolution itself.
enum class Epilogue { kNone, kBias, kBiasRelu };

// Throws dnnl::error when oneDNN has no implementation for the geometry.
std::unique_ptr<ConvPrimitives> Build(const ConvGeometry& g, Epilogue epilogue) {
  auto p = std::make_unique<ConvPrimitives>();
  const memory::dims src_dims = {g.batch, g.in_c, g.in_h, g.in_w};
  const memory::dims weight_dims = {g.out_c, g.in_c, g.k_h, g.k_w};
  const memory::dims dst_dims = {g.batch, g.out_c, g.out_h, g.out_w};
  const memory::dims strides = {g.stride_h, g.stride_w};
  const memory::dims pad_l = {g.pad_top, g.pad_left};
  const memory::dims pad_r = {g.pad_bottom, g.pad_right};
  const auto f32 = memory::data_type::f32;
  p->src = memory::desc(src_dims, f32, Tag::nhwc);
  p->dst = memory::desc(dst_dims, f32, Tag::nhwc);
  p->user_weights = memory::desc(weight_dims, f32, Tag::hwio);
  const memory::desc any_weights(weight_dims, f32, Tag::any);
  const dnnl::primitive_attr attr = UserScratchpad();
  const auto algo = dnnl::algorithm::convolution_direct;

  // The bias and relu run inside the convolution kernel (oneDNN post-op), free of extra passes.
  dnnl::primitive_attr fwd_attr = UserScratchpad();
  if (epilogue == Epilogue::kBiasRelu) {
    dnnl::post_ops relu;
    relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    fwd_attr.set_post_ops(relu);
  }
  const auto fwd_desc =
      epilogue == Epilogue::kNone
          ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, p->src, any_weights, p->dst,
                                            strides, pad_l, pad_r)
          : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, p->src, any_weights,
                                            memory::desc({g.out_c}, f32, Tag::x), p->dst, strides, pad_l, pad_r);
  p->fwd_pd = dnnl::convolution_forward::primitive_desc(fwd_desc, fwd_attr, Engine());
  p->bias = memory::desc({g.out_c}, f32, Tag::x);
  p->fwd = dnnl::convolution_forward(p->fwd_pd);
  p->weights_to_fwd = MakeReorder(p->user_weights, p->fwd_pd.weights_desc());

  p->bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algo, p->src, any_weights, p->dst, strides, pad_l, pad_r), attr, Engine(),
      p->fwd_pd);
  p->bwd_data = dnnl::convolution_backward_data(p->bwd_data_pd);
  p->weights_to_bwd_data = MakeReorder(p->user_weights, p->bwd_data_pd.weights_desc());

  p->bwd_filter_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, p->src, any_weights, p->dst, strides, pad_l, pad_r), attr,
      Engine(), p->fwd_pd);
  p->bwd_filter = dnnl::convolution_backward_weights(p->bwd_filter_pd);
  p->filter_grad_to_user = MakeReorder(p->bwd_filter_pd.diff_weights_desc(), p->user_weights);
  return p;
}

// Primitives per geometry; a geometry oneDNN refused maps to nullptr so it is not retried.
class PrimitiveCache {
 public:
  const ConvPrimitives* Get(const ConvGeometry& g, Epilogue epilogue = Epilogue::kNone) {
    const Key key = {
        g.batch,    g.in_h,     g.in_w,    g.in_c,     g.k_h,        g.k_w,       g.out_c,
        g.stride_h, g.stride_w, g.pad_top, g.pad_left, g.pad_bottom, g.pad_right, static_cast<int64_t>(epilogue)};
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      ++builds_;
      std::unique_ptr<ConvPrimitives> built;
      try {
        built = Build(g, epilogue);
      } catch (const dnnl::error&) {
        built = nullptr;
      }
      it = cache_.emplace(key, std::move(built)).first;
    }
    return it->second.get();  // entries are never removed, so the pointer stays valid
  }

  int64_t builds() {
    absl::MutexLock lock(&mu_);
    return builds_;
  }

 private:
  using Key = std::array<int64_t, 14>;
  absl::Mutex mu_;
  std::map<Key, std::unique_ptr<ConvPrimitives>> cache_ ABSL_GUARDED_BY(mu_);
  int64_t builds_ ABSL_GUARDED_BY(mu_) = 0;
};

PrimitiveCache& Cache() {
  static PrimitiveCache* cache = new PrimitiveCache();  // never destroyed: used until exit
  return *cache;
}

memory Wrap(const memory::desc& desc, const float* data) { return memory(desc, Engine(), const_cast<float*>(data)); }

// Runs `r` from `data` into `buffer` (resized) and returns the memory to use; or wraps `data`
// when no reorder is needed.
memory Reordered(const Reorder& r, const float* data, FloatBuffer& buffer) {
  if (!r.primitive.has_value()) return Wrap(r.to, data);
  buffer.resize(r.to.get_size() / sizeof(float));
  memory to = Wrap(r.to, buffer.data());
  const memory::desc scratch = r.pd->scratchpad_desc();
  r.primitive->execute(
      Stream(),
      {{DNNL_ARG_FROM, Wrap(r.from, data)}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, Wrap(scratch, Scratch(scratch))}});
  return to;
}

}  // namespace

int64_t OneDnnPrimitiveBuilds() { return Cache().builds(); }

bool OneDnnConvForward(const ConvGeometry& g, const float* x, const float* filter, const float* bias, bool relu,
                       float* out) {
  const Epilogue epilogue = bias == nullptr ? Epilogue::kNone : relu ? Epilogue::kBiasRelu : Epilogue::kBias;
  if (bias == nullptr && relu) return false;  // not a combination psflow asks for
  const ConvPrimitives* p = Cache().Get(g, epilogue);
  if (p == nullptr) return false;
  try {
    FloatBuffer weights_buffer;
    memory weights = Reordered(p->weights_to_fwd, filter, weights_buffer);
    const memory::desc scratch = p->fwd_pd.scratchpad_desc();
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, Wrap(p->src, x)},
                                            {DNNL_ARG_WEIGHTS, weights},
                                            {DNNL_ARG_DST, Wrap(p->dst, out)},
                                            {DNNL_ARG_SCRATCHPAD, Wrap(scratch, Scratch(scratch))}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, Wrap(p->bias, bias));
    p->fwd.execute(Stream(), args);
    Stream().wait();
  } catch (const dnnl::error&) {
    return false;
  }
  return true;
}

bool OneDnnConvBackwardData(const ConvGeometry& g, const float* d_out, const float* filter, float* d_x) {
  const ConvPrimitives* p = Cache().Get(g);
  if (p == nullptr) return false;
  try {
    FloatBuffer weights_buffer;
    memory weights = Reordered(p->weights_to_bwd_data, filter, weights_buffer);
    const memory::desc scratch = p->bwd_data_pd.scratchpad_desc();
    p->bwd_data.execute(Stream(), {{DNNL_ARG_DIFF_DST, Wrap(p->dst, d_out)},
                                   {DNNL_ARG_WEIGHTS, weights},
                                   {DNNL_ARG_DIFF_SRC, Wrap(p->src, d_x)},
                                   {DNNL_ARG_SCRATCHPAD, Wrap(scratch, Scratch(scratch))}});
    Stream().wait();
  } catch (const dnnl::error&) {
    return false;
  }
  return true;
}

bool OneDnnConvBackwardFilter(const ConvGeometry& g, const float* x, const float* d_out, float* d_filter) {
  const ConvPrimitives* p = Cache().Get(g);
  if (p == nullptr) return false;
  try {
    const Reorder& to_user = p->filter_grad_to_user;
    FloatBuffer blocked;
    memory grad = Wrap(to_user.from, d_filter);
    if (to_user.primitive.has_value()) {
      blocked.resize(to_user.from.get_size() / sizeof(float));
      grad = Wrap(to_user.from, blocked.data());
    }
    const memory::desc scratch = p->bwd_filter_pd.scratchpad_desc();
    p->bwd_filter.execute(Stream(), {{DNNL_ARG_SRC, Wrap(p->src, x)},
                                     {DNNL_ARG_DIFF_DST, Wrap(p->dst, d_out)},
                                     {DNNL_ARG_DIFF_WEIGHTS, grad},
                                     {DNNL_ARG_SCRATCHPAD, Wrap(scratch, Scratch(scratch))}});
    if (to_user.primitive.has_value()) {
      const memory::desc reorder_scratch = to_user.pd->scratchpad_desc();
      to_user.primitive->execute(Stream(), {{DNNL_ARG_FROM, grad},
                                            {DNNL_ARG_TO, Wrap(to_user.to, d_filter)},
                                            {DNNL_ARG_SCRATCHPAD, Wrap(reorder_scratch, Scratch(reorder_scratch))}});
    }
    Stream().wait();
  } catch (const dnnl::error&) {
    return false;
  }
  return true;
}

}  // namespace psflow::ops::internal
