// The worker session's legal moves (train/session_state.h).
#include "train/session_state.h"

#include "core/check.h"

namespace psflow::train {

bool SessionState::Allowed(Phase from, Phase to) {
  if (from == to) return true;
  switch (from) {
    case kCreated:
      return to == kOpen;
    case kOpen:
    case kStepped:
      return to == kOpen || to == kStepped || to == kFinished || to == kClosed || to == kEnded;
    case kFinished:
      return to == kClosed || to == kEnded;
    case kClosed:
      return to == kEvaluating || to == kEnded;
    case kEvaluating:
      return to == kClosed || to == kEnded;
    case kEnded:
      return false;
  }
  return false;
}

const char* SessionState::Name(Phase phase) {
  switch (phase) {
    case kCreated:
      return "created";
    case kOpen:
      return "open";
    case kStepped:
      return "stepped";
    case kFinished:
      return "finished";
    case kClosed:
      return "closed";
    case kEvaluating:
      return "evaluating";
    case kEnded:
      return "ended";
  }
  return "?";
}

void SessionState::MoveTo(Phase next) {
  CHECK(Allowed(phase_, next)) << "worker session: " << Name(phase_) << " -> " << Name(next) << " is not a legal move";
  phase_ = next;
}

}  // namespace psflow::train
