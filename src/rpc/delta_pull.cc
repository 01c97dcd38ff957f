// 16-bit pulls as deltas from what the worker holds (rpc/delta_pull.h).
#include "rpc/delta_pull.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/random_id.h"

namespace psflow::rpc {
namespace {

bool IsSixteenBitDense(const wire::TensorMeta& meta, WireDtype* dtype) {
  if (meta.sparse()) return false;
  absl::StatusOr<WireDtype> parsed = ParseWireDtype(meta.dtype());
  if (!parsed.ok() || *parsed == WireDtype::kFloat32) return false;
  *dtype = *parsed;
  return true;
}

// The keys of the dense tensors `request` asks to be answered with (none for other methods, and
// for a checkpoint's pull, which is float32).
std::vector<std::string> AskedKeys(Method method, const OutgoingMessage& request) {
  std::vector<std::string> keys;
  if (method == Method::kPull) {
    wire::PullRequest pull;
    if (!pull.ParseFromString(request.header) || pull.with_slots()) return keys;
    for (const std::string& shard : pull.shards()) keys.push_back(shard);
    for (const wire::ShardSlice& s : pull.slices())
      keys.push_back(absl::StrCat(s.shard(), "@", s.offset(), "+", s.count()));
  } else if (method == Method::kPush) {
    wire::PushRequest push;
    if (!push.ParseFromString(request.header)) return keys;
    for (const std::string& shard : push.pull_shards()) keys.push_back(shard);
  }
  return keys;
}

constexpr uint32_t kExponentMask = 0x7f800000u;
inline bool AllFinite(const float* v, int64_t n) {
  uint32_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, v + j, 4);
    bad |= static_cast<uint32_t>((bits & kExponentMask) == kExponentMask);
  }
  return bad == 0;
}

}  // namespace

std::string DeltaKey(const wire::TensorMeta& meta) {
  if (!meta.slice()) return meta.name();
  int64_t count = 1;
  for (int64_t d : meta.shape()) count *= d;
  return absl::StrCat(meta.name(), "@", meta.slice_offset(), "+", count);
}

bool DeltaStep(WireDtype dtype, const float* w, float* held, float* q_out, int64_t n) {
  constexpr int64_t kBlock = 2048;
  alignas(64) float diff[kBlock];
  alignas(64) uint16_t narrow[kBlock];
  bool finite = true;
  for (int64_t first = 0; first < n; first += kBlock) {
    const int64_t m = std::min(kBlock, n - first);
    for (int64_t j = 0; j < m; ++j) diff[j] = w[first + j] - held[first + j];
    EncodeFloats(dtype, diff, m, narrow);
    float* q = q_out + first;
    DecodeFloats(dtype, narrow, m, q);
    float* h = held + first;
    for (int64_t j = 0; j < m; ++j) h[j] += q[j];
    finite = finite && AllFinite(q, m) && AllFinite(h, m);
  }
  return finite;
}

// ---------------------------------------------------------------------------------------------
// The ps's side

DeltaEncoder::DeltaEncoder() : next_seq_(RandomNonZeroId() >> 1), last_sweep_(absl::Now()) {}

std::shared_ptr<DeltaEncoder::Client> DeltaEncoder::ClientOf(uint64_t id) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (now - last_sweep_ > absl::Minutes(1)) {
    last_sweep_ = now;
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (now - it->second->last_seen > kForgetAfter) {
        clients_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  std::shared_ptr<Client>& client = clients_[id];
  if (client == nullptr) client = std::make_shared<Client>();
  client->last_seen = now;
  return client;
}

size_t DeltaEncoder::clients() const {
  absl::MutexLock lock(&mu_);
  return clients_.size();
}

void DeltaEncoder::Encode(const wire::DeltaAnnouncement& announcement, OutgoingMessage* response) {
  if (announcement.client() == 0) return;
  std::shared_ptr<Client> client;
  for (OutgoingTensor& t : response->tensors) {
    WireDtype dtype;
    if (!IsSixteenBitDense(t.meta, &dtype)) continue;
    if (client == nullptr) client = ClientOf(announcement.client());
    const std::string key = DeltaKey(t.meta);
    uint64_t announced = 0;
    for (int k = 0; k < announcement.keys_size() && k < announcement.seqs_size(); ++k) {
      if (announcement.keys(k) == key) announced = announcement.seqs(k);
    }
    const size_t n = static_cast<size_t>(t.num_floats);
    absl::MutexLock lock(&client->mu);
    auto it = client->held.find(key);
    if (announced == 0 && it != client->held.end()) continue;  // claimed by another call: plainly
    if (announced != 0 && it != client->held.end() && it->second.seq == announced && it->second.values.size() == n) {
      auto q = std::make_shared<std::vector<float>>(n);
      if (DeltaStep(dtype, t.data, it->second.values.data(), q->data(), t.num_floats)) {
        it->second.seq = NextSeq();
        t.meta.set_delta_base(announced);
        t.meta.set_delta_seq(it->second.seq);
        t.data = q->data();
        t.owner = std::move(q);
        continue;
      }
    }
    // The values themselves, in float32: the client's copy starts (again) from them.
    Held& held = client->held[key];
    held.seq = NextSeq();
    held.values.assign(t.data, t.data + n);
    t.meta.set_dtype(kWireDtype);
    t.meta.set_delta_base(0);
    t.meta.set_delta_seq(held.seq);
  }
}

// ---------------------------------------------------------------------------------------------
// The worker's side

DeltaDecoder::DeltaDecoder() : id_(RandomNonZeroId()) {}

std::vector<std::string> DeltaDecoder::Announce(Method method, OutgoingMessage* request) {
  std::vector<std::string> claimed;
  {
    absl::MutexLock lock(&mu_);
    if (!active_) return claimed;
  }
  const std::vector<std::string> asked = AskedKeys(method, *request);
  if (asked.empty()) return claimed;
  request->delta.set_client(id_);
  absl::MutexLock lock(&mu_);
  for (const std::string& key : asked) {
    auto it = held_.find(key);
    if (it == held_.end() || claimed_.contains(key)) continue;
    claimed_[key] = true;
    claimed.push_back(key);
    request->delta.add_keys(key);
    request->delta.add_seqs(it->second.seq);
  }
  return claimed;
}

void DeltaDecoder::Release(const std::vector<std::string>& claimed) {
  if (claimed.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const std::string& key : claimed) claimed_.erase(key);
}

absl::StatusOr<IncomingMessage> DeltaDecoder::Decode(IncomingMessage answer, const std::vector<std::string>& claimed) {
  std::vector<std::pair<int, std::shared_ptr<const std::vector<float>>>> replaced;
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < answer.num_tensors(); ++i) {
    const wire::TensorMeta& meta = answer.meta(i);
    if (!meta.sparse() && answer.dtype(i) != WireDtype::kFloat32) active_ = true;
    if (meta.delta_seq() == 0) continue;
    const std::string key = DeltaKey(meta);
    const bool mine = std::find(claimed.begin(), claimed.end(), key) != claimed.end();
    const size_t n = static_cast<size_t>(answer.num_floats(i));
    if (meta.delta_base() == 0) {                     // the values themselves
      if (!mine && claimed_.contains(key)) continue;  // another call's claim decides the copy
      auto values = std::make_shared<std::vector<float>>(n);
      answer.CopyTo(i, values->data());
      held_[key] = Held{meta.delta_seq(), values};
      continue;
    }
    auto it = held_.find(key);
    if (!mine || it == held_.end() || it->second.seq != meta.delta_base() || it->second.values->size() != n) {
      return absl::DataLossError(absl::StrCat(
          "pull of '", key, "' answered as a delta from version ", meta.delta_base(), " but this worker holds ",
          it == held_.end() ? std::string("none") : absl::StrCat("version ", it->second.seq),
          mine ? "" : " (the call did not announce it)"));
    }
    auto values = std::make_shared<std::vector<float>>(n);
    const float* base = it->second.values->data();
    float* out = values->data();
    answer.ForEachRun(i, [base, out](const float* q, int64_t first, int64_t m) {
      for (int64_t j = 0; j < m; ++j) out[first + j] = base[first + j] + q[j];
      return true;
    });
    it->second = Held{meta.delta_seq(), values};
    replaced.emplace_back(i, std::move(values));
  }
  if (replaced.empty()) return answer;
  return answer.WithTensorsReplaced(replaced);
}

// ---------------------------------------------------------------------------------------------
// Decorators

void DeltaChannel::Call(Method method, OutgoingMessage request, const CallOptions& options,
                        std::function<void(absl::StatusOr<IncomingMessage>)> done) {
  std::vector<std::string> claimed = decoder_->Announce(method, &request);
  inner_->Call(method, std::move(request), options,
               [decoder = decoder_, claimed = std::move(claimed),
                done = std::move(done)](absl::StatusOr<IncomingMessage> answer) mutable {
                 if (answer.ok()) answer = decoder->Decode(*std::move(answer), claimed);
                 decoder->Release(claimed);  // the answer's values are its own: later calls may go on
                 done(std::move(answer));
               });
}

namespace {

class DeltaResponder final : public Responder::Impl {
 public:
  DeltaResponder(std::shared_ptr<DeltaEncoder> encoder, wire::DeltaAnnouncement announcement, Responder inner)
      : encoder_(std::move(encoder)), announcement_(std::move(announcement)), inner_(std::move(inner)) {}
  void Respond(absl::StatusOr<OutgoingMessage> response) override {
    if (response.ok()) encoder_->Encode(announcement_, &*response);
    inner_.Respond(std::move(response));
  }

 private:
  const std::shared_ptr<DeltaEncoder> encoder_;
  const wire::DeltaAnnouncement announcement_;
  Responder inner_;
};

}  // namespace

void DeltaHandler::Handle(Method method, IncomingMessage request, Responder responder) {
  if (request.delta_announcement().client() == 0)
    return inner_->Handle(method, std::move(request), std::move(responder));
  wire::DeltaAnnouncement announcement = request.delta_announcement();
  inner_->Handle(method, std::move(request),
                 Responder(std::make_unique<DeltaResponder>(encoder_, std::move(announcement), std::move(responder))));
}

}  // namespace psflow::rpc
