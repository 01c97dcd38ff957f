// CheckpointSchedule (train/checkpointing.h): saves on the multiples of --save_checkpoint_steps,
// whatever step the chief saw when it crossed one (async: the others pushed meanwhile).
#include <gtest/gtest.h>

#include <vector>

#include "train/checkpointing.h"

namespace psflow::train {
namespace {

// The steps at which a chief that sees `seen` (increasing global steps) saves, with each save
// holding the values of the step it saw.
std::vector<int64_t> SavesAt(CheckpointSchedule schedule, const std::vector<int64_t>& seen) {
  std::vector<int64_t> saves;
  for (int64_t step : seen) {
    if (schedule.Due(step)) {
      saves.push_back(step);
      schedule.Saved(step);
    }
  }
  return saves;
}

TEST(CheckpointScheduleTest, SavesOnEveryMultiple) {
  std::vector<int64_t> every;
  for (int64_t s = 1; s <= 35; ++s) every.push_back(s);
  EXPECT_EQ(SavesAt(CheckpointSchedule(10, 0, 0), every), (std::vector<int64_t>{10, 20, 30}));
}

TEST(CheckpointScheduleTest, AStepPastTheBoundaryDoesNotShiftTheNextOnes) {
  // An async chief that first sees 501 (another worker pushed step 500): then 1000, 1500, 2000 —
  // counting 500 from the save made it 1001, 1501 (files were named model.ckpt-501, -1001).
  std::vector<int64_t> seen;
  for (int64_t s = 501; s <= 2000; ++s) seen.push_back(s);
  EXPECT_EQ(SavesAt(CheckpointSchedule(500, 0, 0), seen), (std::vector<int64_t>{501, 1000, 1500, 2000}));
  EXPECT_EQ(SavesAt(CheckpointSchedule(10, 0, 0), {7, 17, 20, 23, 31}), (std::vector<int64_t>{17, 20, 31}));
}

TEST(CheckpointScheduleTest, AResumedJobSavesAtTheNextMultiple) {
  EXPECT_EQ(SavesAt(CheckpointSchedule(10, 0, 17), {18, 19, 20, 21, 30}), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(SavesAt(CheckpointSchedule(10, 0, 20), {21, 29, 30}), (std::vector<int64_t>{30}));
}

TEST(CheckpointScheduleTest, NoStepScheduleNeverSaves) {
  EXPECT_TRUE(SavesAt(CheckpointSchedule(0, 0, 0), {1, 10, 100}).empty());
}

}  // namespace
}  // namespace psflow::train
