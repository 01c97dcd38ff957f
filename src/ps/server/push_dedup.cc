// At-most-once pushes (ps/server/push_dedup.h).
#include "ps/server/push_dedup.h"

#include <algorithm>
#include <bitset>
#include <iterator>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace psflow::ps {

namespace {

// One push of one client.
struct Entry {
  bool answered = false;
  absl::Status status;                  // the answer's status when it was an error
  std::string header;                   // the answer's header when it was OK
  std::vector<rpc::Responder> waiting;  // duplicates that arrived before the answer
};

struct ClientPushes {
  std::map<uint64_t, Entry> by_seq;  // the last kWindow pushes
  uint64_t last_seen = 0;            // State::clock when a push of this client last arrived
  // Which of the last kSeenSeqs sequence numbers (up to `newest`) arrived, answers kept or not: a
  // push older than by_seq's window is a duplicate only if its bit is set. (Slices keep a push's
  // retry in back-off while the client's later slices go on: its first arrival may come after
  // more than kWindow newer pushes.) Bit seq % kSeenSeqs; kSeenSeqs / 8 bytes a client.
  std::bitset<PushDedup::kSeenSeqs> seen;
  uint64_t newest = 0;

  bool Remembers(uint64_t seq) const { return seq + PushDedup::kSeenSeqs > newest; }
  // (A number past `newest` shares its slot with one kSeenSeqs older, whose bit MarkSeen clears.)
  bool Seen(uint64_t seq) const { return seq <= newest && Remembers(seq) && seen.test(Slot(seq)); }
  void MarkSeen(uint64_t seq) {
    if (seq > newest) {  // the slots the newer numbers take over are cleared first
      if (seq - newest >= PushDedup::kSeenSeqs) {
        seen.reset();
      } else {
        for (uint64_t n = newest + 1; n <= seq; ++n) seen.reset(Slot(n));
      }
      newest = seq;
    }
    seen.set(Slot(seq));
  }
  void Unsee(uint64_t seq) {
    if (Remembers(seq)) seen.reset(Slot(seq));
  }
  static uint64_t Slot(uint64_t seq) { return seq % PushDedup::kSeenSeqs; }
};

// A copy of an answer for another caller: the same header, the same tensors (shared).
absl::StatusOr<rpc::OutgoingMessage> Copy(const absl::StatusOr<rpc::OutgoingMessage>& response) {
  if (!response.ok()) return response.status();
  return *response;
}

}  // namespace

struct PushDedup::State {
  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, ClientPushes> clients ABSL_GUARDED_BY(mu);
  uint64_t clock ABSL_GUARDED_BY(mu) = 0;
  int64_t duplicates ABSL_GUARDED_BY(mu) = 0;

  // The push's answer: recorded, then given to the waiting duplicates.
  std::vector<rpc::Responder> Record(uint64_t client_id, uint64_t seq,
                                     const absl::StatusOr<rpc::OutgoingMessage>& response) {
    absl::MutexLock lock(&mu);
    auto client = clients.find(client_id);
    if (client == clients.end()) return {};
    auto entry = client->second.by_seq.find(seq);
    if (entry == client->second.by_seq.end()) return {};
    std::vector<rpc::Responder> waiting = std::move(entry->second.waiting);
    if (absl::IsUnavailable(response.status())) {
      client->second.by_seq.erase(entry);  // not applied: a retry is applied afresh
      client->second.Unsee(seq);
      return waiting;
    }
    entry->second.answered = true;
    if (response.ok()) {
      entry->second.header = response->header;
    } else {
      entry->second.status = response.status();
    }
    return waiting;
  }
};

namespace {

// Answers the original push and records the answer for its duplicates.
class RecordingResponder final : public rpc::Responder::Impl {
 public:
  RecordingResponder(std::shared_ptr<PushDedup::State> state, uint64_t client_id, uint64_t seq, rpc::Responder original)
      : state_(std::move(state)), client_id_(client_id), seq_(seq), original_(std::move(original)) {}

  void Respond(absl::StatusOr<rpc::OutgoingMessage> response) override {
    for (rpc::Responder& duplicate : state_->Record(client_id_, seq_, response)) duplicate.Respond(Copy(response));
    original_.Respond(std::move(response));
  }

 private:
  const std::shared_ptr<PushDedup::State> state_;
  const uint64_t client_id_;
  const uint64_t seq_;
  rpc::Responder original_;
};

}  // namespace

PushDedup::PushDedup() : state_(std::make_shared<State>()) {}
PushDedup::~PushDedup() = default;

std::optional<rpc::Responder> PushDedup::Admit(uint64_t client_id, uint64_t seq, rpc::Responder responder,
                                               const Reanswer& reanswer) {
  if (client_id == 0) return responder;
  std::string header;
  absl::Status status;
  std::vector<ClientPushes> forgotten;  // destroyed after unlocking (held duplicates answer then)
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    auto [client, inserted] = s.clients.try_emplace(client_id);
    client->second.last_seen = ++s.clock;
    if (inserted && s.clients.size() > kMaxClients) {
      // Forget the client seen least recently (never the one just added).
      auto oldest = s.clients.end();
      for (auto it = s.clients.begin(); it != s.clients.end(); ++it) {
        if (it->first != client_id && (oldest == s.clients.end() || it->second.last_seen < oldest->second.last_seen)) {
          oldest = it;
        }
      }
      if (oldest != s.clients.end()) {
        forgotten.push_back(std::move(oldest->second));
        s.clients.erase(oldest);
      }
      client = s.clients.find(client_id);
    }
    ClientPushes& known = client->second;
    std::map<uint64_t, Entry>& pushes = known.by_seq;
    auto entry = pushes.find(seq);
    if (entry == pushes.end()) {
      // The bits, not the answers kept, say whether it came before.
      if (known.Seen(seq)) {
        ++s.duplicates;
        status = absl::FailedPreconditionError(absl::StrCat(
            "push ", seq,
            " of this client was applied before (its answer is no longer kept: the ps task keeps the last ", kWindow,
            "); it is not applied again"));
      } else if (!known.Remembers(seq)) {
        ++s.duplicates;
        status = absl::FailedPreconditionError(
            absl::StrCat("push ", seq, " of this client is older than the last ", kSeenSeqs,
                         " the ps task remembers, so it cannot tell whether it was applied; it is not applied"));
      } else {  // a first arrival, perhaps after newer ones
        pushes.emplace(seq, Entry());
        known.MarkSeen(seq);
        while (static_cast<int>(pushes.size()) > kWindow) {
          // The oldest answer goes, but not the push just admitted (its first arrival came late).
          auto oldest = pushes.begin()->first == seq ? std::next(pushes.begin()) : pushes.begin();
          forgotten.emplace_back().by_seq.insert(pushes.extract(oldest));
        }
        return rpc::Responder(std::make_unique<RecordingResponder>(state_, client_id, seq, std::move(responder)));
      }
    } else {
      ++s.duplicates;
      if (!entry->second.answered) {
        entry->second.waiting.push_back(std::move(responder));  // answered with the original
        return std::nullopt;
      }
      header = entry->second.header;
      status = entry->second.status;
    }
  }
  if (!status.ok()) {
    responder.Respond(status);
  } else {
    responder.Respond(reanswer(header));
  }
  return std::nullopt;
}

void PushDedup::Forget(uint64_t client_id) {
  ClientPushes forgotten;  // destroyed after unlocking
  absl::MutexLock lock(&state_->mu);
  auto it = state_->clients.find(client_id);
  if (it == state_->clients.end()) return;
  forgotten = std::move(it->second);
  state_->clients.erase(it);
}

int64_t PushDedup::duplicates() const {
  absl::MutexLock lock(&state_->mu);
  return state_->duplicates;
}

}  // namespace psflow::ps
