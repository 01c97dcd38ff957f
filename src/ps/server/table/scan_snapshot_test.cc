// The side map behind a scan's consistent view (scan_snapshot.h): a row changed before the scan read
// it is read as it was; one changed after it was read, or made after the scan started, is not kept;
// each change keeps the row once; two snapshots keep what each one started with; a closed snapshot
// keeps nothing.
#include "ps/server/table/scan_snapshot.h"

#include "gtest/gtest.h"

namespace psflow::ps::table {
namespace {

TEST(ScanSnapshotTest, KeepsTheFirstOldRecordOfRowsNotReadYet) {
  auto set = SnapshotSet::Make();
  EXPECT_FALSE(set->any());
  auto snapshot = set->Open(/*start_gen=*/5);
  EXPECT_TRUE(set->any());
  const float old7[2] = {1, 2}, newer7[2] = {3, 4}, old3[2] = {9, 9};
  set->Capture(7, /*gen=*/2, old7, 2, /*last_step=*/10, /*count=*/1);
  set->Capture(7, /*gen=*/2, newer7, 2, 11, 2);  // a stamp left unchanged: the first copy stands
  EXPECT_EQ(snapshot->kept_rows(), 1);

  KeptRow kept;
  EXPECT_EQ(snapshot->Read(3, /*live_gen=*/1, &kept), Snapshot::kLive);  // unchanged since the start
  set->Capture(3, 1, old3, 2, 0, 0);                                     // read already: not kept
  EXPECT_EQ(snapshot->kept_rows(), 1);
  EXPECT_EQ(snapshot->Read(5, /*live_gen=*/5, &kept), Snapshot::kSkip);  // made after the start
  ASSERT_EQ(snapshot->Read(7, /*live_gen=*/5, &kept), Snapshot::kKept);
  EXPECT_EQ(kept.floats, std::vector<float>({1, 2}));
  EXPECT_EQ(kept.last_step, 10);
  EXPECT_EQ(kept.count, 1);
  EXPECT_EQ(snapshot->kept_rows(), 0);  // read rows leave the side map
  snapshot.reset();
  EXPECT_FALSE(set->any());
  set->Capture(9, 1, old3, 2, 0, 0);  // nothing open: nothing kept anywhere
}

TEST(ScanSnapshotTest, EachSnapshotKeepsWhatItStartedWith) {
  auto set = SnapshotSet::Make();
  auto first = set->Open(3);
  const float a[1] = {1}, b[1] = {2};
  set->Capture(4, 1, a, 1, 0, 0);  // changed under `first`: stamped 3 from now on
  auto second = set->Open(6);
  set->Capture(4, 3, b, 1, 0, 0);  // its next change: `second` keeps b, `first` still has a
  KeptRow kept;
  ASSERT_EQ(first->Read(4, 6, &kept), Snapshot::kKept);
  EXPECT_EQ(kept.floats, std::vector<float>({1}));
  ASSERT_EQ(second->Read(4, 6, &kept), Snapshot::kKept);
  EXPECT_EQ(kept.floats, std::vector<float>({2}));
}

}  // namespace
}  // namespace psflow::ps::table
