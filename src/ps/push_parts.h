// ps/push_parts.h — cuts one ps task's share of an async push (or of the chief's Initialize) into
// parts of bounded size, so the ps holds one part in flight instead of the whole message (a
// received message stays in memory until it is applied or copied: without parts a ps peaks at its
// state plus one whole push per concurrent worker, or twice its values at start-up).
//
// The parts go one call after another, each with its own seq (PushRequest.more_parts on all but
// the last); dense tensors bigger than a part are cut into element runs (TensorMeta.slice), which
// the ps applies as one optimizer update per shard (ps/shard.h). Sparse tensors are never cut.
// Sync pushes are never sent in parts: a sync step counts whole pushes. Initialize in parts:
// src/ps/ps_initialize.cc.
#ifndef PSFLOW_PS_PUSH_PARTS_H_
#define PSFLOW_PS_PUSH_PARTS_H_

#include <cstdint>
#include <vector>

#include "rpc/transport.h"

namespace psflow::ps {


// Splits `tensors` (in order) into parts of at most `max_part_bytes` of tensor data each (a
// sparse tensor bigger than that travels alone). One part, unchanged, when they fit. The pieces
// point into the original tensors' memory and share their owners: no copy.
std::vector<std::vector<rpc::OutgoingTensor>> SplitIntoParts(std::vector<rpc::OutgoingTensor> tensors,
                                                            int64_t max_part_bytes);

// One round of a push: a call to each ps task that still has a part to send (the client sends
// round r + 1 once every call of round r was answered).
struct PushRound {
  std::vector<rpc::ClientChannel*> channels;
  std::vector<int> tasks;      // the ps task of each call
  std::vector<bool> last;      // the task's last part: it pulls, and counts toward the global step
  std::vector<rpc::OutgoingMessage> requests;
  std::vector<int64_t> answer_bytes;  // the expected answer's tensor bytes (the pulls), per call
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_PUSH_PARTS_H_
