// The worker session's life cycle (train/session_state.h): the legal moves, what each state lets a
// call do, and an illegal move caught.
#include "train/session_state.h"

#include <gtest/gtest.h>

namespace psflow::train {
namespace {

using P = SessionState::Phase;
constexpr P kAll[] = {SessionState::kCreated,  SessionState::kOpen,   SessionState::kStepped,
                      SessionState::kFinished, SessionState::kClosed, SessionState::kEvaluating,
                      SessionState::kEnded};

TEST(SessionStateTest, AChiefsWholeLife) {
  SessionState s;
  EXPECT_FALSE(s.opened());
  for (P p : {SessionState::kOpen, SessionState::kStepped, SessionState::kStepped, SessionState::kOpen,
              SessionState::kStepped, SessionState::kFinished, SessionState::kClosed, SessionState::kEvaluating,
              SessionState::kClosed, SessionState::kEnded}) {
    s.MoveTo(p);
    EXPECT_EQ(s.phase(), p);
  }
  EXPECT_TRUE(s.ended());
  EXPECT_TRUE(s.closed());
}

TEST(SessionStateTest, WhatEachStateAllows) {
  // opened, is_open, closed, ended, finished, evaluating, claimed
  struct Row {
    P p;
    bool opened, is_open, closed, ended, finished, evaluating, claimed;
  };
  const Row rows[] = {
      {SessionState::kCreated, false, false, false, false, false, false, false},
      {SessionState::kOpen, true, true, false, false, false, false, false},
      {SessionState::kStepped, true, true, false, false, false, false, true},
      {SessionState::kFinished, true, true, false, false, true, false, false},
      {SessionState::kClosed, true, false, true, false, false, false, false},
      {SessionState::kEvaluating, true, false, true, false, false, true, false},
      {SessionState::kEnded, true, false, true, true, false, false, false},
  };
  for (const Row& r : rows) {
    SessionState s;
    // Reach r.p by a legal path.
    if (r.p != SessionState::kCreated) s.MoveTo(SessionState::kOpen);
    if (r.p == SessionState::kEvaluating) s.MoveTo(SessionState::kClosed);
    s.MoveTo(r.p);
    SCOPED_TRACE(SessionState::Name(r.p));
    EXPECT_EQ(s.opened(), r.opened);
    EXPECT_EQ(s.is_open(), r.is_open);
    EXPECT_EQ(s.closed(), r.closed);
    EXPECT_EQ(s.ended(), r.ended);
    EXPECT_EQ(s.finished(), r.finished);
    EXPECT_EQ(s.evaluating(), r.evaluating);
    EXPECT_EQ(s.claimed(), r.claimed);
  }
}

TEST(SessionStateTest, TheIllegalMoves) {
  // Nothing but Open leaves kCreated; nothing leaves kEnded; a finished or closed session never
  // opens again; only Close's evaluate comes back to kClosed.
  for (P to : kAll) {
    EXPECT_EQ(SessionState::Allowed(SessionState::kCreated, to),
              to == SessionState::kCreated || to == SessionState::kOpen);
    EXPECT_EQ(SessionState::Allowed(SessionState::kEnded, to), to == SessionState::kEnded);
  }
  for (P from : {SessionState::kFinished, SessionState::kClosed, SessionState::kEvaluating}) {
    EXPECT_FALSE(SessionState::Allowed(from, SessionState::kOpen)) << SessionState::Name(from);
    EXPECT_FALSE(SessionState::Allowed(from, SessionState::kStepped)) << SessionState::Name(from);
  }
  EXPECT_FALSE(SessionState::Allowed(SessionState::kOpen, SessionState::kEvaluating));
  EXPECT_FALSE(SessionState::Allowed(SessionState::kFinished, SessionState::kEvaluating));
  EXPECT_FALSE(SessionState::Allowed(SessionState::kClosed, SessionState::kFinished));
  // Abort ends every state after Open.
  for (P from : kAll) {
    if (from != SessionState::kCreated) {
      EXPECT_TRUE(SessionState::Allowed(from, SessionState::kEnded));
    }
  }
}

TEST(SessionStateDeathTest, AnIllegalMoveIsABug) {
  SessionState s;
  s.MoveTo(SessionState::kOpen);
  s.MoveTo(SessionState::kEnded);
  EXPECT_DEATH(s.MoveTo(SessionState::kOpen), "ended -> open is not a legal move");
}

}  // namespace
}  // namespace psflow::train
