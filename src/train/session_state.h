// train/session_state.h — a worker session's life cycle (psflow/train/session.h) as one state: where
// the session is between Create and its end, and which moves between them are legal. The session
// asks it what a call may do (Step needs an open session, Lookup also runs inside Close's evaluate,
// the destructor aborts a job not yet ended); a move the table below does not allow is a bug in the
// session, not bad input, and CHECK-fails. A plain value, used by the session's one thread.
//
//   kCreated ─Open─▶ kOpen ⇄ kStepped            (a push claimed the step ⇄ a ps restart re-pulled it)
//   kOpen, kStepped ─OutOfRange─▶ kFinished        (training finished elsewhere)
//   kOpen, kStepped, kFinished ─Close─▶ kClosed ⇄ kEvaluating   (Close runs the caller's evaluate)
//   kClosed ─Shutdown or Goodbye sent─▶ kEnded;  Abort: every state after kCreated ─▶ kEnded
#ifndef PSFLOW_TRAIN_SESSION_STATE_H_
#define PSFLOW_TRAIN_SESSION_STATE_H_

namespace psflow::train {

class SessionState {
 public:
  enum Phase {
    kCreated,     // made by Create; Open not called yet
    kOpen,        // open; the global step was pulled (at Open, or again after a ps restart)
    kStepped,     // open; the global step is the one this worker's last push claimed (data_step)
    kFinished,    // open, but training finished elsewhere: ShouldStop, Step refused, Close allowed
    kClosed,      // Close (or Abort) called, this task's part not over yet (a Close that failed)
    kEvaluating,  // inside Close, the caller's evaluate runs (Lookup still allowed)
    kEnded,       // Shutdown or Goodbye sent, or aborted: nothing left to abort
  };

  Phase phase() const { return phase_; }
  // Moves to `next` (staying put is always allowed); CHECK-fails on a move the diagram forbids.
  void MoveTo(Phase next);
  static bool Allowed(Phase from, Phase to);
  static const char* Name(Phase phase);

  // From here on (Open called, even if it failed part-way) a failure aborts the job.
  bool opened() const { return phase_ != kCreated; }
  bool is_open() const { return phase_ == kOpen || phase_ == kStepped || phase_ == kFinished; }
  bool closed() const { return phase_ == kClosed || phase_ == kEvaluating || phase_ == kEnded; }
  bool ended() const { return phase_ == kEnded; }
  bool finished() const { return phase_ == kFinished; }
  bool evaluating() const { return phase_ == kEvaluating; }
  bool claimed() const { return phase_ == kStepped; }

 private:
  Phase phase_ = kCreated;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SESSION_STATE_H_
