// IncomingMessage / OutgoingMessage / Responder: the transport-independent message types.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/check.h"
#include "core/simd_dispatch.h"
#include "rpc/tensor_coding.h"
#include "rpc/transport.h"

namespace psflow::rpc {

namespace {
thread_local bool t_transport_thread = false;
}  // namespace

void MarkTransportThread() { t_transport_thread = true; }
bool SetTransportThread(bool on) { return std::exchange(t_transport_thread, on); }
bool OnTransportThread() { return t_transport_thread; }

namespace {

// Refuse absurd dimensions before multiplying (2^40 floats = 4 TiB: no real tensor is larger).
constexpr int64_t kMaxDim = int64_t{1} << 40;

// Escaped and shortened: names and dtypes come from the peer, and errors must stay one line.
std::string Printable(const std::string& bytes) {
  constexpr size_t kMaxShown = 200;
  if (bytes.size() <= kMaxShown) return absl::CHexEscape(bytes);
  return absl::StrCat(absl::CHexEscape(bytes.substr(0, kMaxShown)), "...");
}

std::string MetaLabel(const wire::TensorMeta& meta, int i) {
  return absl::StrCat("tensor ", i, " ('", Printable(meta.name()), "')");
}

}  // namespace

OutgoingMessage OutgoingMessage::Of(const google::protobuf::MessageLite& header) {
  OutgoingMessage message;
  message.header = header.SerializeAsString();
  return message;
}

absl::StatusOr<std::vector<IncomingMessage::TensorPlace>> IncomingMessage::PlaceTensors(wire::TensorList* tensors,
                                                                                        int64_t payload_bytes) {
  std::vector<TensorPlace> places;
  places.reserve(static_cast<size_t>(tensors->tensors_size()));
  int64_t offset_bytes = 0;
  for (int i = 0; i < tensors->tensors_size(); ++i) {
    // "" is what a sender from before the dtype field writes; its bytes are float32 too, and the
    // receiver sees the dtype named either way.
    if (tensors->tensors(i).dtype().empty()) tensors->mutable_tensors(i)->set_dtype(kWireDtype);
    const wire::TensorMeta& meta = tensors->tensors(i);
    absl::StatusOr<WireDtype> dtype = ParseWireDtype(meta.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed message: ", MetaLabel(meta, i), " has dtype '", Printable(meta.dtype()),
          "' but psflow exchanges float32, bfloat16 or float16 tensors only (is the peer a different psflow "
          "version?)"));
    }
    const int64_t element_bytes = static_cast<int64_t>(WireDtypeBytes(*dtype));
    int64_t n = 1;
    for (int64_t d : meta.shape()) {
      if (d < 0 || d > kMaxDim) {
        return absl::InvalidArgumentError(
            absl::StrCat("malformed message: ", MetaLabel(meta, i), " has dimension ", d, " (must be 0..2^40)"));
      }
      if (__builtin_mul_overflow(n, d, &n) || n > kMaxDim) {
        return absl::InvalidArgumentError(
            absl::StrCat("malformed message: ", MetaLabel(meta, i), " has too many elements"));
      }
    }
    if (meta.sparse()) {
      if (meta.shape_size() < 1 || meta.shape(0) != meta.rows_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("malformed message: sparse ", MetaLabel(meta, i), " lists ", meta.rows_size(),
                         " rows but its shape's first dimension is ",
                         meta.shape_size() < 1 ? std::string("missing") : absl::StrCat(meta.shape(0))));
      }
      for (int64_t r : meta.rows()) {
        if (r < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("malformed message: sparse ", MetaLabel(meta, i), " has negative row ", r));
        }
      }
    } else if (meta.rows_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("malformed message: dense ", MetaLabel(meta, i), " lists rows"));
    }
    if (payload_bytes >= 0 && n > (payload_bytes - offset_bytes) / element_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed message: ", MetaLabel(meta, i), " needs ", n, " ", WireDtypeName(*dtype), " values but only ",
          payload_bytes - offset_bytes, " bytes remain in the ", payload_bytes, "-byte payload"));
    }
    places.push_back({.dtype = *dtype, .num_floats = n, .offset = offset_bytes});
    offset_bytes += n * element_bytes;
  }
  return places;
}

absl::StatusOr<IncomingMessage> IncomingMessage::Make(std::string header, wire::TensorList tensors,
                                                      std::vector<Segment> payload,
                                                      std::shared_ptr<const void> keepalive, int64_t wire_bytes) {
  IncomingMessage m;
  m.header_ = std::move(header);
  m.tensors_ = std::move(tensors);
  m.keepalive_ = std::move(keepalive);
  m.wire_bytes_ = wire_bytes;
  int64_t payload_bytes = 0;
  for (const Segment& s : payload) {
    if (s.size == 0) continue;
    m.segment_starts_.push_back(payload_bytes);
    m.segments_.push_back(s);
    payload_bytes += static_cast<int64_t>(s.size);
  }
  absl::StatusOr<std::vector<TensorPlace>> places = PlaceTensors(&m.tensors_, payload_bytes);
  if (!places.ok()) return places.status();
  int64_t offset_bytes = 0;
  for (const TensorPlace& p : *places) {
    m.num_floats_.push_back(p.num_floats);
    m.tensor_offsets_.push_back(p.offset);
    m.dtypes_.push_back(p.dtype);
    offset_bytes = p.end();
  }
  if (offset_bytes != payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("malformed message: payload has ", payload_bytes,
                                                   " bytes but the tensor headers describe ", offset_bytes));
  }
  return m;
}

IncomingMessage IncomingMessage::WithTensorsReplaced(
    const std::vector<std::pair<int, std::shared_ptr<const std::vector<float>>>>& replaced) const {
  struct Keepalive {
    std::shared_ptr<const void> original;
    std::vector<std::shared_ptr<const std::vector<float>>> values;
  };
  auto keepalive = std::make_shared<Keepalive>();
  keepalive->original = keepalive_;
  wire::TensorList list = tensors_;
  std::vector<Segment> payload;
  size_t r = 0;
  for (int k = 0; k < num_tensors(); ++k) {
    if (r < replaced.size() && replaced[r].first == k) {
      const std::shared_ptr<const std::vector<float>>& values = replaced[r++].second;
      CHECK_EQ(static_cast<int64_t>(values->size()), num_floats_[k]);
      wire::TensorMeta* meta = list.mutable_tensors(k);
      meta->set_dtype(kWireDtype);
      payload.push_back({reinterpret_cast<const char*>(values->data()), values->size() * sizeof(float)});
      keepalive->values.push_back(values);
      continue;
    }
    const int64_t bytes = num_floats_[k] * static_cast<int64_t>(WireDtypeBytes(dtypes_[k]));
    ForEachByteRange(tensor_offsets_[k], bytes, [&payload](const char* p, size_t n, int64_t) {
      payload.push_back({p, n});
      return true;
    });
  }
  CHECK_EQ(r, replaced.size()) << "replaced tensors must be in ascending order";
  absl::StatusOr<IncomingMessage> made =
      Make(header_, std::move(list), std::move(payload), std::move(keepalive), wire_bytes_);
  CHECK(made.ok()) << made.status();
  return *std::move(made);
}

absl::Status IncomingMessage::ParseHeader(google::protobuf::MessageLite* message) const {
  if (!message->ParseFromString(header_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: header does not parse as ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

template <typename Fn>
void IncomingMessage::ForEachByteRange(int64_t begin, int64_t size, Fn&& fn) const {
  if (size <= 0) return;
  // Segment holding byte `begin`: the last one starting at or before it.
  size_t s = static_cast<size_t>(std::upper_bound(segment_starts_.begin(), segment_starts_.end(), begin) -
                                 segment_starts_.begin() - 1);
  int64_t pos = begin;
  const int64_t end = begin + size;
  while (pos < end) {
    CHECK_LT(s, segments_.size());
    const int64_t in_segment = pos - segment_starts_[s];
    const int64_t take = std::min<int64_t>(end - pos, static_cast<int64_t>(segments_[s].size) - in_segment);
    if (!fn(segments_[s].data + in_segment, static_cast<size_t>(take), pos - begin)) return;
    pos += take;
    ++s;
  }
}

void IncomingMessage::CopyTo(int i, float* dst) const {
  if (dtypes_[i] != WireDtype::kFloat32) return CopyRange(i, 0, num_floats_[i], dst);
  char* out = reinterpret_cast<char*>(dst);
  ForEachByteRange(tensor_offsets_[i], num_floats_[i] * 4, [out](const char* p, size_t n, int64_t at) {
    std::memcpy(out + at, p, n);
    return true;
  });
}

void IncomingMessage::CopyRange(int i, int64_t first, int64_t count, float* dst) const {
  CHECK(first >= 0 && count >= 0 && first + count <= num_floats_[i]);
  if (dtypes_[i] != WireDtype::kFloat32) {
    ForEachRunInRange(i, first, count, [dst, first](const float* run, int64_t at, int64_t n) {
      std::memcpy(dst + (at - first), run, static_cast<size_t>(n) * sizeof(float));
      return true;
    });
    return;
  }
  char* out = reinterpret_cast<char*>(dst);
  ForEachByteRange(tensor_offsets_[i] + first * 4, count * 4, [out](const char* p, size_t n, int64_t at) {
    std::memcpy(out + at, p, n);
    return true;
  });
}

void IncomingMessage::CopyStrided(int i, float* dst, int64_t block, int64_t stride) const {
  if (num_floats_[i] == 0) return;
  CHECK_GT(block, 0);
  CHECK_EQ(num_floats_[i] % block, 0);
  if (block == stride) return CopyTo(i, dst);
  const int64_t blocks = num_floats_[i] / block;
  if (dtypes_[i] != WireDtype::kFloat32) {
    for (int64_t k = 0; k < blocks; ++k) CopyRange(i, k * block, block, dst + k * stride);
    return;
  }
  for (int64_t k = 0; k < blocks; ++k) {
    char* out = reinterpret_cast<char*>(dst + k * stride);
    ForEachByteRange(tensor_offsets_[i] + k * block * 4, block * 4, [out](const char* p, size_t n, int64_t at) {
      std::memcpy(out + at, p, n);
      return true;
    });
  }
}

bool IncomingMessage::ForEachRun(int i,
                                 const std::function<bool(const float* run, int64_t first, int64_t n)>& fn) const {
  return ForEachRunInRange(i, 0, num_floats_[i], fn);
}

bool IncomingMessage::ForEachRunInRange(
    int i, int64_t range_first, int64_t range_count,
    const std::function<bool(const float* run, int64_t first, int64_t n)>& fn) const {
  CHECK(range_first >= 0 && range_count >= 0 && range_first + range_count <= num_floats_[i]);
  if (dtypes_[i] != WireDtype::kFloat32) return ForEachWidenedRun(i, range_first, range_count, fn);
  // Received bytes may sit anywhere in a slice (TCP reads split the stream at arbitrary points), and
  // kernels may assume float alignment, so misaligned bytes go through this bounce buffer.
  constexpr size_t kBounceFloats = 4096;
  alignas(64) float bounce[kBounceFloats];
  char* bounce_bytes = reinterpret_cast<char*>(bounce);
  size_t held = 0;             // bytes in the bounce buffer
  int64_t next = range_first;  // index of the next float to hand out
  bool go_on = true;
  auto flush = [&] {
    if (held >= 4 && go_on) {
      go_on = fn(bounce, next, static_cast<int64_t>(held / 4));
      next += static_cast<int64_t>(held / 4);
    }
    held = 0;
  };
  ForEachByteRange(tensor_offsets_[i] + range_first * 4, range_count * 4, [&](const char* p, size_t len, int64_t at) {
    // Complete a float split across the previous piece and this one.
    const size_t skip = std::min(len, static_cast<size_t>((4 - at % 4) % 4));
    std::memcpy(bounce_bytes + held, p, skip);
    held += skip;
    p += skip;
    len -= skip;
    if (len == 0) return go_on;
    if (reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
      flush();
      const size_t n = len / 4;
      if (n > 0 && go_on) {
        go_on = fn(reinterpret_cast<const float*>(p), next, static_cast<int64_t>(n));
        next += static_cast<int64_t>(n);
      }
      std::memcpy(bounce_bytes, p + n * 4, len - n * 4);
      held = len - n * 4;
      return go_on;
    }
    while (len > 0 && go_on) {
      const size_t take = std::min(len, sizeof(bounce) - held);
      std::memcpy(bounce_bytes + held, p, take);
      held += take;
      p += take;
      len -= take;
      if (held == sizeof(bounce)) flush();
    }
    return go_on;
  });
  flush();
  return go_on;
}

bool IncomingMessage::ForEachByteRunInRange(
    int i, int64_t range_first, int64_t range_count,
    const std::function<bool(const void* run, int64_t first, int64_t n)>& fn) const {
  CHECK(range_first >= 0 && range_count >= 0 && range_first + range_count <= num_floats_[i]);
  if (dtypes_[i] != WireDtype::kFloat32) {
    return ForEachWidenedRun(i, range_first, range_count,
                             [&fn](const float* run, int64_t first, int64_t n) { return fn(run, first, n); });
  }
  alignas(4) char carry[4];  // a float split across two pieces
  size_t carried = 0;
  bool go_on = true;
  ForEachByteRange(tensor_offsets_[i] + range_first * 4, range_count * 4, [&](const char* p, size_t len, int64_t at) {
    if (carried > 0) {
      const size_t take = std::min(len, 4 - carried);
      std::memcpy(carry + carried, p, take);
      carried += take;
      p += take;
      len -= take;
      at += static_cast<int64_t>(take);
      if (carried < 4) return true;
      carried = 0;
      go_on = fn(carry, range_first + at / 4 - 1, 1);
      if (!go_on) return false;
    }
    const size_t n = len / 4;
    if (n > 0) {
      go_on = fn(p, range_first + at / 4, static_cast<int64_t>(n));
      if (!go_on) return false;
    }
    carried = len - n * 4;
    std::memcpy(carry, p + n * 4, carried);
    return true;
  });
  return go_on;
}

bool IncomingMessage::ForEachWidenedRun(
    int i, int64_t range_first, int64_t range_count,
    const std::function<bool(const float* run, int64_t first, int64_t n)>& fn) const {
  // 16-bit values gathered (a value may be split across two pieces) and widened a block at a time.
  constexpr size_t kBlock = 4096;
  alignas(64) uint16_t narrow[kBlock];
  alignas(64) float wide[kBlock];
  const WireDtype dtype = dtypes_[i];
  char* narrow_bytes = reinterpret_cast<char*>(narrow);
  size_t held = 0;  // bytes in `narrow`
  int64_t next = range_first;
  bool go_on = true;
  ForEachByteRange(tensor_offsets_[i] + range_first * 2, range_count * 2, [&](const char* p, size_t len, int64_t) {
    while (len > 0 && go_on) {
      const size_t take = std::min(len, sizeof(narrow) - held);
      std::memcpy(narrow_bytes + held, p, take);
      held += take;
      p += take;
      len -= take;
      if (held == sizeof(narrow)) {
        DecodeFloats(dtype, narrow, kBlock, wide);
        go_on = fn(wide, next, kBlock);
        next += kBlock;
        held = 0;
      }
    }
    return go_on;
  });
  if (held >= 2 && go_on) {
    const int64_t n = static_cast<int64_t>(held / 2);
    DecodeFloats(dtype, narrow, n, wide);
    go_on = fn(wide, next, n);
  }
  return go_on;
}

namespace {

int64_t FirstNonFiniteBytes(const char* p, size_t n) {
  if (!simd::AnyNonFinite(p, static_cast<int64_t>(n))) return -1;
  for (size_t j = 0; j < n; ++j) {
    float v;
    std::memcpy(&v, p + 4 * j, sizeof(v));
    if (!std::isfinite(v)) return static_cast<int64_t>(j);
  }
  return -1;
}

}  // namespace

void IncomingMessage::MarkFinitePrefix(int i, int64_t n) {
  CHECK(i >= 0 && i < num_tensors() && n >= 0 && n <= num_floats_[i]);
  if (finite_prefix_.empty()) finite_prefix_.assign(static_cast<size_t>(num_tensors()), 0);
  finite_prefix_[i] = n;
}

int64_t IncomingMessage::FirstNonFinite(int i, int64_t first, int64_t count) const {
  if (!finite_prefix_.empty() && first < finite_prefix_[i]) {  // known finite: not read again
    const int64_t skip = std::min(count, finite_prefix_[i] - first);
    first += skip;
    count -= skip;
  }
  if (count <= 0) return -1;
  int64_t found = -1;
  ForEachByteRunInRange(i, first, count, [&found](const void* run, int64_t at, int64_t n) {
    const int64_t j = FirstNonFiniteBytes(static_cast<const char*>(run), static_cast<size_t>(n));
    if (j >= 0) found = at + j;
    return j < 0;
  });
  return found;
}

void IncomingMessage::AddTo(int i, float* dst) const {
  ForEachRun(i, [dst](const float* run, int64_t first, int64_t n) {
    float* out = dst + first;
    for (int64_t j = 0; j < n; ++j) out[j] += run[j];
    return true;
  });
}

WireBytes ToWireBytes(const OutgoingTensor& tensor) {
  WireBytes out;
  const absl::StatusOr<WireDtype> dtype = ParseWireDtype(tensor.meta.dtype());
  if (!dtype.ok() || *dtype == WireDtype::kFloat32) {  // another dtype is a test's, to be refused: as float32
    out.data = tensor.data;
    out.bytes = static_cast<size_t>(tensor.num_floats) * sizeof(float);
    return out;
  }
  auto converted = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(tensor.num_floats));
  EncodeFloats(*dtype, tensor.data, tensor.num_floats, converted->data());
  out.data = converted->data();
  out.bytes = converted->size() * sizeof(uint16_t);
  out.owner = std::move(converted);
  return out;
}

absl::StatusOr<IncomingMessage> ClientChannel::CallBlocking(Method method, OutgoingMessage request,
                                                            const CallOptions& options) {
  struct Waiter {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<IncomingMessage> result ABSL_GUARDED_BY(mu);
  };
  CHECK(!OnTransportThread()) << "a blocking call from a completion callback would deadlock; use Call";
  auto waiter = std::make_shared<Waiter>();
  {
    CompletionsHere here;  // a gRPC call's answer is read and completed on this thread
    Call(method, std::move(request), options, [waiter](absl::StatusOr<IncomingMessage> result) {
      absl::MutexLock lock(&waiter->mu);
      waiter->result = std::move(result);
      waiter->done = true;
    });
  }
  absl::MutexLock lock(&waiter->mu);
  waiter->mu.Await(absl::Condition(&waiter->done));
  return std::move(waiter->result);
}

Responder& Responder::operator=(Responder&& other) {
  if (this != &other) {
    if (impl_) impl_->Respond(absl::InternalError("call dropped without an answer"));
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Responder::~Responder() {
  if (impl_) impl_->Respond(absl::InternalError("call dropped without an answer"));
}

void Responder::Respond(absl::StatusOr<OutgoingMessage> response) {
  CHECK(impl_ != nullptr) << "Respond called twice";
  std::unique_ptr<Impl> impl = std::move(impl_);
  impl->Respond(std::move(response));
}

namespace {
struct MethodInfo {
  std::string name;
  std::string path;
};
const MethodInfo* Methods() {
  static const MethodInfo* methods = [] {
    static constexpr const char* kNames[kNumMethods] = {"Hello", "Initialize", "MarkInitialized", "WaitInitialized",
                                                        "Pull",  "Push",       "Goodbye",         "Shutdown",
                                                        "Stats", "LoadTable",  "ScanTable",       "WorkQueue"};
    auto* m = new MethodInfo[kNumMethods];
    for (int i = 0; i < kNumMethods; ++i) {
      m[i].name = kNames[i];
      m[i].path = absl::StrCat("/psflow.wire.Ps/", kNames[i]);
    }
    return m;
  }();
  return methods;
}
}  // namespace

const std::string& MethodPath(Method method) { return Methods()[static_cast<int>(method)].path; }
const std::string& MethodName(Method method) { return Methods()[static_cast<int>(method)].name; }

}  // namespace psflow::rpc
