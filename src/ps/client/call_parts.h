// ps/client/call_parts.h — the calls of a push or pull, one round after another (CallRound), and
// the cutting of one ps task's share of an async push (or of the chief's Initialize, or of a pull)
// into parts of bounded size, so the ps holds one part in flight instead of the whole
// message (a received message stays in memory until it is applied or copied, and an answer until
// it is sent: without parts a ps peaks at its state plus one whole push per concurrent worker,
// twice its values at start-up, and a copy of a shard whenever an update meets a pull's answer
// still being sent).
//
// The parts go one call after another, each with its own seq (PushRequest.more_parts on all but
// the last); dense tensors bigger than a part are cut into element runs (TensorMeta.slice), which
// the ps applies as one optimizer update per shard (ps/server/shard.h). Sparse tensors are never cut.
// Sync pushes are never sent in parts: a sync step counts whole pushes. Initialize in parts:
// src/ps/server/ps_initialize.cc. A pull (or a push-and-pull's pull) bigger than a part asks for element
// runs (PullRequest.slices), a Pull call per part after the push's last part was answered; the
// ps answers each call from one buffer holding copies of its runs (ps/server/shard.h, Shard::CopySlice).
#ifndef PSFLOW_PS_CLIENT_CALL_PARTS_H_
#define PSFLOW_PS_CLIENT_CALL_PARTS_H_

#include <cstdint>
#include <vector>

#include "psflow/core/tensor.h"
#include "psflow/dist/partition.h"
#include "rpc/transport.h"

namespace psflow::ps {

// Splits `tensors` (in order) into parts of at most `max_part_bytes` of tensor data each (a
// sparse tensor bigger than that travels alone). One part, unchanged, when they fit. The pieces
// point into the original tensors' memory and share their owners: no copy.
std::vector<std::vector<rpc::OutgoingTensor>> SplitIntoParts(std::vector<rpc::OutgoingTensor> tensors,
                                                             int64_t max_part_bytes);

// Where one pulled shard goes: its values into `dest` (the whole variable); for a checkpoint's
// pull (PullRequest.with_slots) also its optimizer slots into `slots` (the variable's, allocated
// by the caller) and its update count into `updates`.
struct PullTarget {
  const dist::ShardSpec* shard = nullptr;
  Tensor* dest = nullptr;
  std::vector<Tensor>* slots = nullptr;
  int64_t* updates = nullptr;
};

// A run of a pulled shard's elements, [offset, offset + count): the whole shard, or a part's
// piece of it.
struct SliceTarget {
  PullTarget target;
  int64_t offset = 0;
  int64_t count = 0;
};

// Cuts the pull of `runs` (in order; whole shards) into parts of at most `max_part_bytes` of
// tensor data (a checkpoint's pull moves 1 + the optimizer's slots floats per element:
// `floats_per_element`): pieces of the runs, in order, a run cut where a part fills.
std::vector<std::vector<SliceTarget>> SplitPullIntoParts(const std::vector<SliceTarget>& runs, int64_t max_part_bytes,
                                                         int64_t floats_per_element = 1);

struct TableBlockCall;  // ps/client/table_calls.h

// One call of a round: to one ps task, with where its answer goes.
struct Call {
  int task = 0;  // the ps task called
  rpc::ClientChannel* channel = nullptr;
  rpc::OutgoingMessage request;
  int64_t answer_bytes = 0;         // the expected answer's tensor bytes (sizes the deadline)
  bool last = true;                 // push: the task's last part, which counts toward the global step
  bool whole_pull = false;          // the answer carries whole shards (a Pull, or a push's pull that fits)
  std::vector<SliceTarget> slices;  // a pull in parts: where each answered run goes
  // Table blocks whose rows the answer ends with (ps/client/table_calls.h), or null.
  const std::vector<TableBlockCall>* table_pulls = nullptr;
  bool tables_only = false;  // a Pull of table rows alone (its task's dense pull goes in parts)
};

// One round of a push or pull: a call to each ps task that still has a part to send or fetch
// (the client sends round r + 1 once every call of round r was answered). A push's rounds (its
// parts, the last one asking for the pull when it fits in a part) come first, then the pull's
// parts, if it has any.
struct CallRound {
  rpc::Method method = rpc::Method::kPush;
  double timeout_secs = 0;
  bool with_slots = false;  // a checkpoint's pull: values, slots and update counts
  std::vector<Call> calls;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_CALL_PARTS_H_
