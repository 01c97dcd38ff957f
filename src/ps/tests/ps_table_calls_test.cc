// The table checkpoint calls, LoadTable and ScanTable, over real gRPC as a peer sends them: a scan's
// parts carry the rows in id order with their slots and the ps's step; loading before Initialize,
// after MarkInitialized, or rows of a table the ps does not hold is refused with one line saying so;
// rows loaded come back from a scan; the calls are their own (a Push or Pull never carries them). An
// incremental scan through PsClient::ScanTable on two ps tasks hands over only the rows pushed since
// the save it follows and the ids removed since (in its first part); one the ps tasks cannot answer
// is FailedPrecondition naming the table. Scans opened by a chief whose process is replaced (a
// restarted chief says Hello as worker 0 again) are dropped at once, logged, and the old scans'
// reads refused.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/psflow.pb.h"
#include "ps/tests/ps_tables_test_util.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

using namespace table_testing;  // NOLINT: the table tests' helpers
using ::testing::HasSubstr;
using testing::Sgd;
using testing::TestCluster;

std::string Int64Bytes(const std::vector<int64_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

std::vector<int64_t> Int64s(const std::string& bytes) {
  std::vector<int64_t> out(bytes.size() / sizeof(int64_t));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(int64_t));
  return out;
}

std::unique_ptr<rpc::ClientChannel> ChannelTo(const TestCluster& cluster) {
  auto made = rpc::MakeGrpcChannel(cluster.cluster.ps()[0], "ps task 0", {});
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

rpc::CallOptions Deadline() {
  rpc::CallOptions o;
  o.timeout_secs = 10;
  return o;
}

absl::StatusOr<rpc::IncomingMessage> Scan(rpc::ClientChannel& channel, const std::string& table, uint64_t scan_id,
                                          int64_t max_rows) {
  wire::TableScan scan;
  scan.set_table(table);
  scan.set_scan_id(scan_id);
  scan.set_max_rows(max_rows);
  return channel.CallBlocking(rpc::Method::kScanTable, rpc::OutgoingMessage::Of(scan), Deadline());
}

// A LoadTable of `ids` into table `table` (dim `dim`, `slots` slots), every float `value`.
absl::Status Load(rpc::ClientChannel& channel, const std::string& table, const std::vector<int64_t>& ids, int64_t dim,
                  int slots, float value) {
  wire::LoadTableRequest load;
  wire::TableRows* rows = load.add_rows();
  rows->set_table(table);
  rows->set_ids(Int64Bytes(ids));
  rows->set_last_step(Int64Bytes(std::vector<int64_t>(ids.size(), 4)));
  rows->set_count(Int64Bytes(std::vector<int64_t>(ids.size(), 2)));
  rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(load);
  for (int k = 0; k <= slots; ++k) {
    auto floats = std::make_shared<FloatBuffer>(ids.size() * static_cast<size_t>(dim), value + k);
    rpc::OutgoingTensor t;
    t.meta.set_name(table);
    t.meta.add_shape(static_cast<int64_t>(ids.size()));
    t.meta.add_shape(dim);
    t.meta.set_slot(k);
    t.data = floats->data();
    t.num_floats = static_cast<int64_t>(floats->size());
    t.owner = std::move(floats);
    message.tensors.push_back(std::move(t));
  }
  return channel.CallBlocking(rpc::Method::kLoadTable, std::move(message), Deadline()).status();
}

TEST(TableCallsTest, ScanTableAnswersPartsInIdOrderWithSlotsAndStep) {
  TrainingConfig config = Sgd(0.1f);
  config.sparse_optimizer = "adagrad";
  Job job = StartJob(TablePlan({Dynamic("hashed", 3)}, 1, 1), 1, config);
  const std::vector<int64_t> ids = {42, -7, 5};
  const Tensor g({3, 3}, 0.5f);
  TableStep t;
  t.pushes.push_back({"hashed", &ids, nullptr, &g});
  ASSERT_TRUE(job.workers[0]->PushAndPull({}, 0, {}, t).ok());

  auto channel = ChannelTo(*job.cluster);
  ASSERT_NE(channel, nullptr);
  std::vector<int64_t> seen;
  bool done = false;
  for (int part = 0; part < 3 && !done; ++part) {
    auto answer = Scan(*channel, "hashed", 77, 2);
    ASSERT_TRUE(answer.ok()) << answer.status();
    wire::ScanTableResponse response;
    ASSERT_TRUE(answer->ParseHeader(&response).ok());
    EXPECT_EQ(response.step(), 1);  // the ps's global step after the one push
    const std::vector<int64_t> part_ids = Int64s(response.part().rows().ids());
    EXPECT_LE(part_ids.size(), 2u);
    ASSERT_EQ(answer->num_tensors(), 2);  // values, adagrad's accumulator
    EXPECT_EQ(answer->num_floats(0), static_cast<int64_t>(part_ids.size()) * 3);
    EXPECT_EQ(Int64s(response.part().rows().count()), std::vector<int64_t>(part_ids.size(), 1));
    seen.insert(seen.end(), part_ids.begin(), part_ids.end());
    done = response.part().done();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(seen, (std::vector<int64_t>{-7, 5, 42}));

  auto unknown = Scan(*channel, "nope", 78, 2);
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("nope"));
}

TEST(TableCallsTest, LoadTableStoresRowsBeforeMarkInitializedOnly) {
  const dist::PlacementPlan plan = TablePlan({Dynamic("hashed", 2)}, 1, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto channel = ChannelTo(*cluster);
  ASSERT_NE(channel, nullptr);
  // Before Initialize: no model to load into.
  const absl::Status early = Load(*channel, "hashed", {1}, 2, 0, 0.5f);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;

  // The chief's restore (PsClient::Initialize with table sources) sends LoadTable between Initialize
  // and MarkInitialized; here a source of one part, then a scan of what the ps holds.
  auto chief = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(chief->Connect());
  TableRowsPart saved;
  saved.table = "hashed";
  saved.ids = {3, 9};
  saved.last_step = {5, 6};
  saved.count = {1, 2};
  saved.values = Tensor({2, 2}, 0.25f);
  bool given = false;
  TablePartSource source = [&](TableRowsPart* out) -> absl::StatusOr<bool> {
    if (given) return false;
    given = true;
    *out = saved;
    return true;
  };
  ModelSnapshot state;
  state.variables.push_back({"w", Tensor({2}, 0.0f), {}, 0});
  PSFLOW_ASSERT_OK(chief->Initialize(state, Sgd(0.1f), {{"hashed", source}}));
  auto answer = Scan(*channel, "hashed", 5, 10);
  ASSERT_TRUE(answer.ok()) << answer.status();
  wire::ScanTableResponse response;
  ASSERT_TRUE(answer->ParseHeader(&response).ok());
  EXPECT_EQ(Int64s(response.part().rows().ids()), saved.ids);
  EXPECT_EQ(Int64s(response.part().rows().last_step()), saved.last_step);
  EXPECT_EQ(Int64s(response.part().rows().count()), saved.count);
  std::vector<float> values(4);
  answer->CopyTo(0, values.data());
  EXPECT_EQ(values, std::vector<float>(4, 0.25f));

  // After MarkInitialized: refused, naming why.
  const absl::Status late = Load(*channel, "hashed", {1}, 2, 0, 0.5f);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("after MarkInitialized"));
}

TEST(TableCallsTest, LoadTableRefusesRowsTheTableCannotHold) {
  TrainingConfig config = Sgd(0.1f);
  config.sparse_optimizer = "adagrad";
  const dist::PlacementPlan plan = TablePlan({Dynamic("hashed", 2)}, 1, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto chief = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(chief->Connect());
  TableRowsPart wrong;  // values only: adagrad's accumulator missing
  wrong.table = "hashed";
  wrong.ids = {3};
  wrong.last_step = {1};
  wrong.count = {1};
  wrong.values = Tensor({1, 2}, 1.0f);
  bool given = false;
  TablePartSource source = [&](TableRowsPart* out) -> absl::StatusOr<bool> {
    if (given) return false;
    given = true;
    *out = wrong;
    return true;
  };
  ModelSnapshot state;
  state.variables.push_back({"w", Tensor({2}, 0.0f), {}, 0});
  const absl::Status s = chief->Initialize(state, config, {{"hashed", source}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("restore: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("slots"));
}

// Every row and removed id of a scan of `table` on `client`.
struct Scanned {
  std::vector<int64_t> ids, removed;
  size_t parts = 0;
};
absl::StatusOr<Scanned> ScanWith(PsClient& client, const std::string& table, const TableScanOptions& options) {
  Scanned out;
  absl::Status s = client.ScanTable(table, 2, options, [&](TableRowsPart p) {
    if (!p.removed_ids.empty()) {
      EXPECT_EQ(out.parts, 0u) << "removed ids after the first part";
    }
    ++out.parts;
    out.ids.insert(out.ids.end(), p.ids.begin(), p.ids.end());
    out.removed.insert(out.removed.end(), p.removed_ids.begin(), p.removed_ids.end());
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

TEST(TableCallsTest, AnIncrementalScanReadsTheRowsChangedAndTheIdsRemovedSince) {
  TrainingConfig config = Sgd(0.1f);
  config.sparse_optimizer = "adagrad";
  dist::TableSpec spec = Dynamic("hashed", 3);
  spec.lifecycle.steps_to_live = 2;  // rows not pushed in the last 2 steps go at the next pass
  spec.lifecycle.evict_every = 1000;
  Job job = StartJob(TablePlan({spec}, 2, 1), 1, config);
  PsClient& client = *job.workers[0];
  auto push = [&](const std::vector<int64_t>& ids) {
    const Tensor g({static_cast<int64_t>(ids.size()), 3}, 0.5f);
    TableStep t;
    t.pushes.push_back({"hashed", &ids, nullptr, &g});
    ASSERT_TRUE(client.PushAndPull({}, 0, {}, t).ok());
  };
  TableScanOptions increment;
  increment.save_id = 1;
  increment.increment = true;
  increment.changed_since = 0;
  increment.track_changes = true;
  // Never saved: nothing to follow.
  auto refused = ScanWith(client, "hashed", increment);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("hashed"));

  push({1, 2, 3, 4, 5, 6});  // step 1
  TableScanOptions full;
  full.save_id = 2;
  full.track_changes = true;
  auto all = ScanWith(client, "hashed", full);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->ids, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(all->removed.empty());

  push({2, 5});     // step 2
  push({5, 9, 2});  // step 3: rows 1, 3, 4, 6 were last pushed at step 1, and go at the next save's pass
  increment.save_id = 3;
  increment.changed_since = 2;
  auto changed = ScanWith(client, "hashed", increment);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->ids, (std::vector<int64_t>{2, 5, 9}));
  // Removed: the rows of save 2 gone now (each ps's step counts the pushes it received, so which of
  // 1, 3, 4, 6 have aged out depends on the routing).
  full.save_id = 4;
  auto now = ScanWith(client, "hashed", full);
  ASSERT_TRUE(now.ok()) << now.status();
  std::vector<int64_t> gone;
  std::set_difference(all->ids.begin(), all->ids.end(), now->ids.begin(), now->ids.end(), std::back_inserter(gone));
  EXPECT_FALSE(gone.empty());
  EXPECT_EQ(changed->removed, gone);

  // Nothing since: an empty increment.
  increment.save_id = 5;
  increment.changed_since = 4;
  auto nothing = ScanWith(client, "hashed", increment);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_TRUE(nothing->ids.empty());
  EXPECT_TRUE(nothing->removed.empty());
}

TEST(TableCallsTest, ARestartedChiefsPredecessorsOpenScansAreDropped) {
  TrainingConfig config = Sgd(0.1f);
  dist::PlacementPlan plan = TablePlan({Dynamic("hashed", 3)}, 1, 1);
  Job job = StartJob(plan, 1, config);
  PsClient& chief = *job.workers[0];
  const std::vector<int64_t> ids = {1, 2, 3};
  const Tensor g({3, 3}, 0.5f);
  TableStep t;
  t.pushes.push_back({"hashed", &ids, nullptr, &g});
  ASSERT_TRUE(chief.PushAndPull({}, 0, {}, t).ok());
  TableScanOptions save;
  save.save_id = 4;
  ASSERT_TRUE(chief.OpenTableScans({"hashed"}, save).ok());
  // The chief "restarts": a new process of worker 0 says Hello.
  std::unique_ptr<PsClient> restarted = job.cluster->Client(plan, 0, {});
  ASSERT_TRUE(restarted->Connect().ok());
  EXPECT_THAT(job.cluster->LogText(),
              HasSubstr("ps task 0: dropped the scan of table 'hashed' for save 4, opened by worker 0's previous "
                        "process, which was replaced (restarted)"));
  // The old scan reads no rows of a later moment: refused.
  auto late = ScanWith(chief, "hashed", save);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("was dropped"));
  // The new chief's own saves scan as ever.
  save.save_id = 5;
  auto fresh = ScanWith(*restarted, "hashed", save);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->ids, ids);
}

}  // namespace
}  // namespace psflow::ps
