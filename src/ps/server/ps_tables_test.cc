// The one check of table ids on a ps task, where they enter it (PsTables::Decode for pulls, pushes
// and prefetches, PsTables::Load for checkpoint rows): each refusal is one InvalidArgument line
// naming the table and the id, and a refused request changes no row of any table of the task. The
// shards behind it trust their ids (table_shard.h); the client's own refusals, which keep a call
// all-or-nothing across ps tasks, are tested end to end in ps/tests/ps_tables_test.cc.
#include "ps/server/ps_tables.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ps/common/wire_config.h"
#include "psflow/dist/table_routing.h"

namespace psflow::ps {
namespace {

bool Mentions(const absl::Status& s, const std::string& what) {
  return s.message().find(what) != absl::string_view::npos;
}

TableDeclaration Declared(const std::string& name, int64_t n, int shards) {
  TableDeclaration d;
  d.spec.name = name;
  d.spec.dim = 2;
  d.spec.initializer = dist::TableInitializer::Uniform(-1, 1, /*seed=*/7);
  if (n > 0) {
    d.spec.num_embeddings = n;
    d.spec.strategy = dist::TableStrategy::kDiv;
  } else {
    d.spec.kind = dist::TableKind::kDynamic;
  }
  d.num_shards = shards;
  return d;
}

// Ps task `ps` of 2: shard `ps` of the fixed table "emb" (10 ids, 2 shards: ids 0-4 and 5-9) and
// its share of the dynamic table "hashed".
std::unique_ptr<PsTables> TablesOfTask(int ps) {
  TrainingConfig config;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1.0f;
  config.tables = {Declared("emb", 10, 2), Declared("hashed", 0, 1)};
  wire::InitializeRequest init;
  *init.mutable_config() = ToWire(config);
  for (const char* table : {"emb", "hashed"}) {
    wire::TableShardInfo* info = init.add_table_shards();
    info->set_table(table);
    info->set_shard(ps);
    info->set_num_ps(2);
  }
  auto tables = PsTables::Create(init, ps);
  EXPECT_TRUE(tables.ok()) << tables.status();
  return tables.ok() ? *std::move(tables) : nullptr;
}

std::string Bytes(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}

// A push message: blocks (table block name, ids) with their gradient rows as tensors 0..n-1.
struct Push {
  google::protobuf::RepeatedPtrField<wire::TableRows> blocks;
  rpc::IncomingMessage message;
};

Push MakePush(const std::vector<std::pair<std::string, std::vector<int64_t>>>& blocks,
              const std::vector<std::vector<float>>& rows) {
  Push p;
  wire::TensorList list;
  auto floats = std::make_shared<std::vector<std::vector<float>>>(rows);
  std::vector<rpc::IncomingMessage::Segment> payload;
  int64_t bytes = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    wire::TableRows* w = p.blocks.Add();
    w->set_table(blocks[b].first);
    w->set_ids(Bytes(blocks[b].second));
    wire::TensorMeta* meta = list.add_tensors();
    meta->set_name(blocks[b].first);
    meta->add_shape(static_cast<int64_t>((*floats)[b].size()));  // [ids, dim] flat: a wrong count reaches Decode
    payload.push_back({reinterpret_cast<const char*>((*floats)[b].data()), (*floats)[b].size() * sizeof(float)});
    bytes += static_cast<int64_t>((*floats)[b].size() * sizeof(float));
  }
  auto message = rpc::IncomingMessage::Make("", list, payload, floats, bytes);
  EXPECT_TRUE(message.ok()) << message.status();
  if (message.ok()) p.message = *std::move(message);
  return p;
}

std::vector<float> Rows(PsTables& tables, const std::string& name, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * 2);
  absl::Status s = tables.Find(name)->shard->Gather(ids, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(PsTablesDecodeTest, EveryBadIdIsRefusedAtTheEntryWithNothingApplied) {
  auto tables = TablesOfTask(0);
  ASSERT_NE(tables, nullptr);
  int64_t foreign = 0;  // a dynamic id of ps task 1
  while (dist::RouteDynamicId(foreign, 2) == 0) ++foreign;
  int64_t own = 0;  // and one of ps task 0
  while (dist::RouteDynamicId(own, 2) != 0) ++own;
  const std::vector<float> emb_before = Rows(*tables, "emb/part_0", {0, 1, 2, 3, 4});
  const std::vector<float> hashed_before = Rows(*tables, "hashed", {own});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<std::pair<std::string, std::vector<int64_t>>> blocks;
    std::vector<std::vector<float>> rows;
    std::string says;
  };
  // Each case holds a good block of "hashed" first: it must not be applied either.
  const std::vector<Case> cases = {
      {{{"hashed", {own}}, {"emb/part_0", {3, 7}}}, {{1, 1}, {1, 1, 1, 1}}, "id 7 belongs to shard 1, not 0"},
      {{{"hashed", {own}}, {"emb/part_0", {3, 10}}}, {{1, 1}, {1, 1, 1, 1}}, "id 10 is outside the vocabulary [0, 10)"},
      {{{"hashed", {own}}, {"emb/part_0", {-1}}}, {{1, 1}, {1, 1}}, "id -1 is outside the vocabulary"},
      {{{"hashed", {own, foreign}}}, {{1, 1, 1, 1}}, "id " + std::to_string(foreign) + " belongs to shard 1, not 0"},
      {{{"hashed", {own}}, {"emb/part_0", {3, 3}}}, {{1, 1}, {1, 1, 1, 1}}, "id 3 listed twice in one push"},
      {{{"hashed", {own}}, {"emb/part_0", {3, 4}}}, {{1, 1}, {1, 1, 1, nan}}, "gradient row of id 4 holds nan"},
      {{{"hashed", {own}}, {"emb/part_0", {3, 4}}}, {{1, 1}, {1, inf, 1, 1}}, "gradient row of id 3 holds inf"},
      {{{"hashed", {own}}, {"emb/part_0", {3, 4}}}, {{1, 1}, {1, 1, 1}}, "3 floats for 2 ids of dim 2"},
      {{{"hashed", {own}}, {"nope", {3}}}, {{1, 1}, {1, 1}}, "table 'nope': no such table shard on ps task 0"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.says);
    Push push = MakePush(k.blocks, k.rows);
    auto decoded = tables->Decode(push.blocks, &push.message, 0);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(decoded.status(), k.says)) << decoded.status();
    EXPECT_EQ(std::string(decoded.status().message()).find('\n'), std::string::npos);
    // The same ids as a pull (or a prefetch): refused too, but for the rows' own faults.
    if (k.says.find("holds") == std::string::npos && k.says.find("floats") == std::string::npos) {
      auto pulled = tables->Decode(push.blocks, nullptr, 0);
      EXPECT_FALSE(pulled.ok());
      EXPECT_TRUE(Mentions(pulled.status(), k.says)) << pulled.status();
    }
  }
  EXPECT_EQ(Rows(*tables, "emb/part_0", {0, 1, 2, 3, 4}), emb_before);
  EXPECT_EQ(Rows(*tables, "hashed", {own}), hashed_before);
  for (const auto& t : tables->list()) EXPECT_EQ(t->shard->stats().rows_pushed, 0) << t->name;

  // A good push decodes and applies (sgd, lr 1).
  Push good = MakePush({{"hashed", {own}}, {"emb/part_0", {3, 4}}}, {{0.5f, 0.5f}, {1, 2, 3, 4}});
  auto decoded = tables->Decode(good.blocks, &good.message, 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(tables->ApplyAsync(*decoded, 1).ok());
  const std::vector<float> emb_after = Rows(*tables, "emb/part_0", {3, 4});
  EXPECT_EQ(emb_after,
            (std::vector<float>{emb_before[6] - 1, emb_before[7] - 2, emb_before[8] - 3, emb_before[9] - 4}));
}

TEST(PsTablesDecodeTest, CheckpointRowsOfAnotherShardAreRefused) {
  auto tables = TablesOfTask(1);  // "emb/part_1": ids 5-9
  ASSERT_NE(tables, nullptr);
  for (const std::vector<int64_t>& ids : std::vector<std::vector<int64_t>>{{5, 2}, {5, 12}}) {
    google::protobuf::RepeatedPtrField<wire::TableRows> blocks;
    wire::TableRows* w = blocks.Add();
    w->set_table("emb/part_1");
    w->set_ids(Bytes(ids));
    const std::vector<int64_t> zeros(ids.size(), 0);
    w->set_last_step(Bytes(zeros));
    w->set_count(Bytes(zeros));
    Push rows = MakePush({{"emb/part_1", ids}}, {{1, 1, 1, 1}});
    const absl::Status s = tables->Load(blocks, rows.message);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s, "table 'emb") && Mentions(s, "id " + std::to_string(ids[1]))) << s;
  }
}

// A scan call to `tables` (max_rows 0: open only; > 0: read a part; < 0: close).
absl::Status ScanCall(PsTables& tables, const std::string& table, uint64_t scan_id, uint64_t client, int64_t max_rows,
                      int64_t save_id = 3) {
  wire::TableScan scan;
  scan.set_table(table);
  scan.set_scan_id(scan_id);
  scan.set_max_rows(max_rows);
  scan.set_save_id(save_id);
  scan.set_client_id(client);
  wire::TableScanPart part;
  rpc::OutgoingMessage out;
  return tables.ScanPart(scan, 0, &part, &out);
}

// A scan its chief left open (dead, or its save stopped) is dropped once its client made no scan
// call for the bound, said in a line naming the table, the save and the flag; a read of it later is
// Aborted saying so (never a scan opened again at a later moment).
TEST(PsTablesScanBoundTest, AScanLeftUnreadPastTheBoundIsDroppedAndALaterReadRefused) {
  auto tables = TablesOfTask(0);
  ASSERT_NE(tables, nullptr);
  ASSERT_TRUE(ScanCall(*tables, "hashed", 11, /*client=*/5, 0).ok());
  const absl::Time opened = absl::Now();
  EXPECT_TRUE(tables->DropIdleScans(opened + absl::Minutes(4), absl::Minutes(5), "--flag").empty());
  const std::vector<std::string> dropped = tables->DropIdleScans(opened + absl::Minutes(6), absl::Minutes(5), "--flag");
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_TRUE(dropped[0].find("dropped the scan of table 'hashed' for save 3, not read for 300 s (--flag)") !=
              std::string::npos)
      << dropped[0];
  const absl::Status late = ScanCall(*tables, "hashed", 11, 5, 10);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_TRUE(Mentions(late, "ps task 0: the scan of table 'hashed' for save 3 was dropped, not read for 300 s"))
      << late;
  // Closing it is quiet; a new scan (another id) opens as ever.
  EXPECT_TRUE(ScanCall(*tables, "hashed", 11, 5, -1).ok());
  EXPECT_TRUE(ScanCall(*tables, "hashed", 12, 5, 10).ok());
}

// Every scan call of a client keeps all of its scans alive (a save reads its tables in turn); a
// replaced client's scans (a restarted chief's predecessor) go at once, another client's stay.
TEST(PsTablesScanBoundTest, AClientsCallsKeepItsScansAndAReplacedClientsScansGo) {
  auto tables = TablesOfTask(0);
  ASSERT_NE(tables, nullptr);
  ASSERT_TRUE(ScanCall(*tables, "hashed", 21, /*client=*/5, 0).ok());
  ASSERT_TRUE(ScanCall(*tables, "emb/part_0", 22, 5, 0).ok());
  ASSERT_TRUE(ScanCall(*tables, "emb/part_0", 22, 5, 1).ok());  // reads emb: hashed's scan is alive too
  const absl::Time read = absl::Now();
  EXPECT_TRUE(tables->DropIdleScans(read + absl::Minutes(4), absl::Minutes(5), "--flag").empty());
  EXPECT_EQ(tables->DropIdleScans(read + absl::Minutes(6), absl::Minutes(5), "--flag").size(), 2u);

  ASSERT_TRUE(ScanCall(*tables, "hashed", 31, /*client=*/7, 0).ok());
  ASSERT_TRUE(ScanCall(*tables, "emb/part_0", 32, /*client=*/8, 0).ok());
  const std::vector<std::string> dropped = tables->DropScansOf(7, "worker 0");
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_TRUE(dropped[0].find("dropped the scan of table 'hashed' for save 3, opened by worker 0's previous process") !=
              std::string::npos)
      << dropped[0];
  EXPECT_EQ(ScanCall(*tables, "hashed", 31, 7, 10).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(ScanCall(*tables, "emb/part_0", 32, 8, 10).ok());  // client 8's scan reads on
  EXPECT_TRUE(tables->DropScansOf(0, "nobody").empty());         // an unknown client names no scan
}

}  // namespace
}  // namespace psflow::ps
