// rpc/delta_pull.h (internal) — 16-bit pulls as deltas from what the worker already holds
// (--wire_dtype=bfloat16|float16), so a worker computes on its ps's float32 values up to the
// rounding of one step's change, not of the values themselves.
//
// A 16-bit pull answered plainly rounds every value to 8 (bfloat16) or 11 (float16) significant
// bits, and the worker computes on those. Instead, a ps keeps, per client and per pulled tensor
// (a shard, or a run of one in a pull in parts: its key), the float32 values that client holds
// and a version number; it answers with q = round16(w - held), adds q to its copy, and the client
// adds the same q to its copy, float32 additions of the same operands on both sides, so the two
// copies stay bit-identical and differ from the ps's values w by one rounding of a step's change
// (the ps's own error feedback: what rounding lost is in the next delta).
//
// Protocol (TensorList.delta, TensorMeta.delta_base / delta_seq in proto/psflow.proto):
//  - A client starts announcing itself once it received a 16-bit tensor (so float32 jobs send
//    the same bytes as before): each Pull, and each Push asking for pull_shards, names the client
//    (a random id per channel) and, for each tensor the request asks for that the client holds and
//    no other call in flight claims, the version it holds (the call claims it until answered).
//  - The ps answers each dense 16-bit tensor of such a request with a delta against the
//    announced version when it holds that version (delta_base = it, delta_seq = the new one);
//    with the float32 values when the client announced a version it does not hold (lost answer,
//    ps restarted, state expired), when the tensor is new to both, or when a delta or the copy
//    would not be finite (delta_base 0: the client replaces its copy); and plainly rounded (as
//    before, nothing kept) when the client did not announce a tensor the ps keeps for it (another
//    call of that client claims it).
//  - A client applies a delta only to the version it names; any other is refused (DataLoss), never
//    applied to the wrong values. A full answer replaces the client's copy unless another call
//    claims the key.
// Cost: on each ps, a float32 copy of what every worker pulled (the model's size per worker);
// per-client copies unseen for 10 minutes are dropped (the next pull is a full one).
//
// StartServer (transport.h) puts a DeltaHandler around every server, and MakeChannel a
// DeltaChannel around the channels of a 16-bit --wire_dtype (a float32 job's calls skip it);
// channels and servers made directly (MakeGrpcChannel, StartGrpcServer) answer and pull plainly,
// and either side alone keeps the plain protocol. Thread-safe.
#ifndef PSFLOW_RPC_DELTA_PULL_H_
#define PSFLOW_RPC_DELTA_PULL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/transport.h"

namespace psflow::rpc {

// The key of a pulled dense tensor: its shard name, or "name@offset+count" for a run of one.
std::string DeltaKey(const wire::TensorMeta& meta);

// One delta step over n floats: q = round(w - held) in `dtype` (as float32 values, which `dtype`
// represents exactly) into q_out, and held += q. False when some q or held value is not finite
// (held is then unspecified: the caller replaces it).
bool DeltaStep(WireDtype dtype, const float* w, float* held, float* q_out, int64_t n);

// The ps's side: what each client holds.
class DeltaEncoder {
 public:
  DeltaEncoder();
  // Rewrites the dense 16-bit tensors of `response`, the answer to a request carrying
  // `announcement` (client 0: left as it is).
  void Encode(const wire::DeltaAnnouncement& announcement, OutgoingMessage* response) ABSL_LOCKS_EXCLUDED(mu_);
  // Clients with kept copies (tests).
  size_t clients() const ABSL_LOCKS_EXCLUDED(mu_);

  // Copies of a client unseen this long are dropped.
  static constexpr absl::Duration kForgetAfter = absl::Minutes(10);

 private:
  struct Held {
    uint64_t seq = 0;
    std::vector<float> values;
  };
  struct Client {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, Held> held ABSL_GUARDED_BY(mu);
    absl::Time last_seen;  // guarded by DeltaEncoder::mu_
  };
  std::shared_ptr<Client> ClientOf(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t NextSeq() { return next_seq_.fetch_add(1, std::memory_order_relaxed); }

  std::atomic<uint64_t> next_seq_;  // starts at random: versions of an earlier ps never match
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Client>> clients_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_);
};

// The worker's side, one per channel: the copies it holds.
class DeltaDecoder {
 public:
  DeltaDecoder();
  // Before a call: adds the announcement to `request` (once active) and claims the keys it
  // announces; returns them (for Decode and Release).
  std::vector<std::string> Announce(Method method, OutgoingMessage* request) ABSL_LOCKS_EXCLUDED(mu_);
  // After the call: `answer` with its delta and full tensors turned into float32 values (and
  // kept). DataLoss naming the tensor for a delta against a version this side does not hold.
  absl::StatusOr<IncomingMessage> Decode(IncomingMessage answer, const std::vector<std::string>& claimed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the claims of a call (answered or failed).
  void Release(const std::vector<std::string>& claimed) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t id() const { return id_; }

 private:
  struct Held {
    uint64_t seq = 0;
    std::shared_ptr<const std::vector<float>> values;
  };
  const uint64_t id_;
  absl::Mutex mu_;
  bool active_ ABSL_GUARDED_BY(mu_) = false;  // a 16-bit tensor was received
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, bool> claimed_ ABSL_GUARDED_BY(mu_);  // keys of calls in flight
};

// A channel whose calls announce and decode delta pulls around `inner`'s.
class DeltaChannel final : public ClientChannel {
 public:
  explicit DeltaChannel(std::unique_ptr<ClientChannel> inner)
      : inner_(std::move(inner)), decoder_(std::make_shared<DeltaDecoder>()) {}
  void Call(Method method, OutgoingMessage request, const CallOptions& options,
            std::function<void(absl::StatusOr<IncomingMessage>)> done) override;
  const std::string& peer_name() const override { return inner_->peer_name(); }
  ClientChannel* inner() const { return inner_.get(); }

 private:
  const std::unique_ptr<ClientChannel> inner_;
  const std::shared_ptr<DeltaDecoder> decoder_;
};

// A handler answering through `inner` (borrowed), with the answers of announced clients encoded
// as deltas.
class DeltaHandler final : public Handler {
 public:
  explicit DeltaHandler(Handler* inner) : inner_(inner), encoder_(std::make_shared<DeltaEncoder>()) {}
  void Handle(Method method, IncomingMessage request, Responder responder) override;
  const DeltaEncoder& encoder() const { return *encoder_; }

 private:
  Handler* const inner_;
  const std::shared_ptr<DeltaEncoder> encoder_;  // shared with answers still pending
};

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_DELTA_PULL_H_
