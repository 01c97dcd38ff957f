// ps/server/push_dedup.h — makes a ps task apply each push at most once, so that a client may retry a
// push whose answer it did not get (a missed deadline, a broken connection: ps/client/call_deadline.h).
//
// Every push carries its client's id (random per PsClient) and a sequence number (1, 2, ... per
// client; PushRequest.client_id / seq). The push path calls Admit() at its entry:
//   - a push not seen before gets back a Responder to answer through; the answer given to it is
//     recorded (and also given to the duplicates that arrived meanwhile);
//   - a duplicate of a push still in progress (e.g. held for its sync step's quorum) waits for the
//     same outcome: it is answered together with the original, and counts nowhere;
//   - a duplicate of an answered push is answered at once with the recorded answer: its header
//     (step, stale) and status as they were. The pulled values of a push-and-pull are not kept
//     (that would pin a copy of every pulled shard per client, and make the next update of each
//     copy first); they are read again by `reanswer`, at least as new as the first answer's.
// Client id 0 (a client that predates these fields) is never deduplicated.
//
// Memory is bounded: per client, the last kWindow pushes (a client has one push per ps in flight
// at a time, a few when it pipelines, a step's parts when it pushes as backward goes); at most kMaxClients clients, the
// least recently seen forgotten first. A duplicate older than its client's window (its answer forgotten) is refused
// with FailedPrecondition and not applied; a push older than the window that never arrived before
// (a slice's retry overtaken by the client's later slices) is applied: which of the last kSeenSeqs
// numbers arrived is kept as bits. One older still is refused (the ps cannot tell). An answer
// Unavailable (the ps stopping before it applied the push) is not recorded, so a retry is applied
// afresh.
//
// Thread-safe. The recording Responders share the table's state, so they may outlive the
// PushDedup (a ps stopping while calls are held).
#ifndef PSFLOW_PS_SERVER_PUSH_DEDUP_H_
#define PSFLOW_PS_SERVER_PUSH_DEDUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rpc/transport.h"

namespace psflow::ps {

class PushDedup {
 public:
  static constexpr int kWindow = 64;
  static constexpr uint64_t kSeenSeqs = 16384;  // which of them arrived, answers or not (2 KiB a client)
  static constexpr size_t kMaxClients = 4096;

  // Rebuilds the answer to a duplicate from the recorded answer's header (the serialized
  // PushResponse), adding the values it asks to pull as they are now.
  using Reanswer = std::function<rpc::OutgoingMessage(const std::string& header)>;

  PushDedup();
  ~PushDedup();

  // See above. nullopt: `responder` was a duplicate's and has been (or will be) answered here.
  std::optional<rpc::Responder> Admit(uint64_t client_id, uint64_t seq, rpc::Responder responder,
                                      const Reanswer& reanswer);
  // The client left (Goodbye): its answers are dropped.
  void Forget(uint64_t client_id);
  // Duplicates answered so far (tests, logs).
  int64_t duplicates() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_SERVER_PUSH_DEDUP_H_
