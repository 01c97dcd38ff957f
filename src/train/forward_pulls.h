// train/forward_pulls.h — the pull after a step in forward order (--overlap=push_pull,
// docs/sync-async.md#overlap): the parameters, in their order (the order a forward uses them),
// cut into groups of about kGroupBytes (a parameter never split; a group closed before a
// parameter that would make it bigger), pulled a group after another with kWindow groups in
// flight, so the first layers' values arrive first and a forward can start on them while later
// layers still come. Wait(i) blocks until parameter i's group has landed.
//
// With --transfer_slice_bytes (ps::PsClient::PullBackSlices; async): a big variable whose
// gradient went ahead as an early part comes back slice by slice as the ps answers its push
// slices, during backward; Arm (Start) leaves the variables that came so out of the groups, and
// Wait(i) waits for parameter i's slices instead.
//
// Owned by the worker session (train/session.cc), which starts a pull after a step and settles it
// before anything else touches the value buffers or the client. Thread-safe: the groups' answers
// arrive on transport threads; Start, Arm, Wait and Settle are called by the session's thread, Fire
// from any (a push's completion).
#ifndef PSFLOW_TRAIN_FORWARD_PULLS_H_
#define PSFLOW_TRAIN_FORWARD_PULLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "psflow/core/tensor.h"
#include "psflow/ps/ps_client.h"

namespace psflow::train {

class ForwardPulls {
 public:
  static constexpr int64_t kGroupBytes = 256 << 10;
  static constexpr int kWindow = 2;

  // `client` and the tensors of `out` are borrowed and must outlive this (it settles on
  // destruction).
  ForwardPulls(ps::PsClient* client, std::vector<std::pair<std::string, Tensor*>> out);
  ~ForwardPulls();
  ForwardPulls(const ForwardPulls&) = delete;
  ForwardPulls& operator=(const ForwardPulls&) = delete;

  // Starts pulling every group (the last pull must have been settled).
  void Start();
  // Start in two halves, for a pull that must follow a push still in flight (async: so that the
  // values hold this worker's own last push, the same every run): Arm, on the session's thread
  // before the push is sent, makes every Wait block; Fire, from the push's completion (a transport
  // thread), starts the groups — or, given the push's failure, pulls nothing, releases the waiters
  // and keeps the failure for Settle.
  void Arm();
  void Fire(const absl::Status& push);
  // Waits until parameter `index`'s group has arrived (or failed); at once when no pull runs.
  void Wait(int index);
  // Waits for every group; returns the pull's first failure (OK when none, or when no pull was
  // started) and forgets it.
  absl::Status Settle();
  // A pull was started and not settled yet.
  bool active() const;
  // A group of the running pull (or a slice) failed (the session then pushes nothing more of this
  // step early).
  bool failed() const;
  int num_groups() const { return static_cast<int>(groups_.size()); }
  // Parameters the running pull left to their slices (ps::SlicePulls), ascending.
  std::vector<int> sliced() const;

 private:
  struct State;
  void Launch(int group);
  // The first group from `group` on with something to pull this time (num_groups() if none).
  int NextToPull(int group) const;

  ps::PsClient* const client_;
  std::vector<std::vector<std::pair<std::string, Tensor*>>> groups_;
  std::vector<std::vector<int>> group_params_;  // each group's parameter indices
  std::vector<int> group_of_;                   // parameter index -> its group
  // What a pull asks for of each group: its parameters but those coming by slices. Written by Arm
  // before the pull can start, read by the launches (also from the answers' threads).
  std::vector<std::vector<std::pair<std::string, Tensor*>>> current_;
  std::vector<bool> by_slices_;  // per parameter, set by Arm: its values come by slices
  std::shared_ptr<State> state_;
  std::unique_ptr<ps::SlicePulls> slices_;  // null without --transfer_slice_bytes; last: destroyed first
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_FORWARD_PULLS_H_
