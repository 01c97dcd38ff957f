// Every struct<->proto conversion of ps/common/wire_config.h round-trips every field, and cannot drift:
//   - proto -> struct -> proto with every field of the message (found by reflection, nested ones
//     included) set to a distinct non-default value: a field one direction forgets comes back
//     default, one that lands in another field comes back different;
//   - struct -> proto -> struct the same way, with the struct's fields taken by a structured
//     binding of their exact number: a field added to the struct stops this test compiling
//     until it is converted, and the message must have as many fields.
// Then what crosses them end to end over real gRPC: PsClient::Stats() reports the connected workers
// (regression: issue 11.6, it reported 0), and the chief's traffic table against the ps's own
// final numbers.
#include "ps/common/wire_config.h"

#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"
#include "rpc/tensor_coding.h"

namespace psflow::ps {
namespace {

namespace pb = google::protobuf;

// Sets every field of `m` (recursively) to a value distinct from every other field's and from
// its default; `k` numbers the fields.
void FillDistinct(pb::Message* m, int* k) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {  // two distinct elements
      ASSERT_EQ(f->cpp_type(), pb::FieldDescriptor::CPPTYPE_INT32)
          << f->full_name() << ": extend FillDistinct for repeated fields of its type";
      r->AddInt32(m, f, 100 + ++*k);
      r->AddInt32(m, f, 100 + ++*k);
      continue;
    }
    const int v = ++*k;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, 100 + v); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, (int64_t{1} << 40) + v); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, 100 + v); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, (uint64_t{1} << 40) + v); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, 0.5f + v); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, 0.25 + v); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, "value" + std::to_string(v)); break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: FillDistinct(r->MutableMessage(m, f), k); break;
      default: FAIL() << f->full_name() << ": extend FillDistinct for its type";
    }
  }
}

template <typename Message>
void ExpectProtoRoundTrip() {
  Message w;
  int k = 0;
  FillDistinct(&w, &k);
  const Message back = ToWire(FromWire(w));
  std::string diff;
  pb::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(w, back)) << Message::descriptor()->full_name() << " lost fields:\n" << diff;
}

// Distinct non-default values for struct fields.
void Set(int& x, int v) { x = 100 + v; }
void Set(int64_t& x, int v) { x = (int64_t{1} << 40) + v; }
void Set(float& x, int v) { x = 0.5f + v; }
void Set(double& x, int v) { x = 0.25 + v; }
void Set(bool& x, int) { x = true; }  // every bool of these structs defaults to false
void Set(std::string& x, int v) { x = "value" + std::to_string(v); }

TEST(WireConfigTest, TrainingConfigFromTheWireAndBack) { ExpectProtoRoundTrip<wire::TrainingConfig>(); }

TEST(WireConfigTest, StatsFromTheWireAndBack) { ExpectProtoRoundTrip<wire::StatsResponse>(); }

TEST(WireConfigTest, TrainingConfigToTheWireAndBackKeepsEveryField) {
  TrainingConfig c;
  // Exactly the struct's fields: adding one breaks this line until it is converted and listed.
  auto& [optimizer, sync, replicas, total, train_steps, timeout, initial_step] = c;
  auto& [name, lr, momentum, init_acc, beta1, beta2, adam_eps, rms_decay, rms_momentum, rms_eps, decay_steps,
         decay_rate, staircase] = optimizer;
  EXPECT_EQ(wire::TrainingConfig::descriptor()->field_count(), 7);
  EXPECT_EQ(wire::OptimizerConfig::descriptor()->field_count(), 13);
  int k = 0;
  Set(name, ++k), Set(lr, ++k), Set(momentum, ++k), Set(init_acc, ++k), Set(beta1, ++k), Set(beta2, ++k);
  Set(adam_eps, ++k), Set(rms_decay, ++k), Set(rms_momentum, ++k), Set(rms_eps, ++k), Set(decay_steps, ++k);
  Set(decay_rate, ++k), Set(staircase, ++k);
  Set(sync, ++k), Set(replicas, ++k), Set(total, ++k), Set(train_steps, ++k), Set(timeout, ++k);
  Set(initial_step, ++k);

  const TrainingConfig back = FromWire(ToWire(c));
  const auto& [b_optimizer, b_sync, b_replicas, b_total, b_train_steps, b_timeout, b_initial_step] = back;
  const auto& [b_name, b_lr, b_momentum, b_init_acc, b_beta1, b_beta2, b_adam_eps, b_rms_decay, b_rms_momentum,
               b_rms_eps, b_decay_steps, b_decay_rate, b_staircase] = b_optimizer;
  EXPECT_EQ(b_name, name);
  EXPECT_EQ(b_lr, lr);
  EXPECT_EQ(b_momentum, momentum);
  EXPECT_EQ(b_init_acc, init_acc);
  EXPECT_EQ(b_beta1, beta1);
  EXPECT_EQ(b_beta2, beta2);
  EXPECT_EQ(b_adam_eps, adam_eps);
  EXPECT_EQ(b_rms_decay, rms_decay);
  EXPECT_EQ(b_rms_momentum, rms_momentum);
  EXPECT_EQ(b_rms_eps, rms_eps);
  EXPECT_EQ(b_decay_steps, decay_steps);
  EXPECT_EQ(b_decay_rate, decay_rate);
  EXPECT_EQ(b_staircase, staircase);
  EXPECT_EQ(b_sync, sync);
  EXPECT_EQ(b_replicas, replicas);
  EXPECT_EQ(b_total, total);
  EXPECT_EQ(b_train_steps, train_steps);
  EXPECT_EQ(b_timeout, timeout);
  EXPECT_EQ(b_initial_step, initial_step);
}

TEST(WireConfigTest, StatsToTheWireAndBackKeepsEveryField) {
  PsTaskStats s;
  auto& [task, bytes_in, bytes_out, num_params, global_step, stale, refused, unauthenticated, connected,
         connected_indices, pushed_indices] = s;
  EXPECT_EQ(wire::StatsResponse::descriptor()->field_count(), 11);
  int k = 0;
  Set(task, ++k), Set(bytes_in, ++k), Set(bytes_out, ++k), Set(num_params, ++k), Set(global_step, ++k);
  Set(stale, ++k), Set(refused, ++k), Set(unauthenticated, ++k), Set(connected, ++k);
  connected_indices = {0, 2, 5};
  pushed_indices = {1, 2};
  const PsTaskStats back = FromWire(ToWire(s));
  const auto& [b_task, b_bytes_in, b_bytes_out, b_num_params, b_global_step, b_stale, b_refused, b_unauthenticated,
               b_connected, b_connected_indices, b_pushed_indices] = back;
  EXPECT_EQ(b_connected_indices, connected_indices);
  EXPECT_EQ(b_pushed_indices, pushed_indices);
  EXPECT_EQ(b_task, task);
  EXPECT_EQ(b_bytes_in, bytes_in);
  EXPECT_EQ(b_bytes_out, bytes_out);
  EXPECT_EQ(b_num_params, num_params);
  EXPECT_EQ(b_global_step, global_step);
  EXPECT_EQ(b_stale, stale);
  EXPECT_EQ(b_refused, refused);
  EXPECT_EQ(b_unauthenticated, unauthenticated);
  EXPECT_EQ(b_connected, connected);
}

// --- End to end, over real gRPC ------------------------------------------------------------------

using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

// Bytes the gRPC transport counts for a header-only message (rpc/tensor_coding.h's layout).
int64_t EncodedBytes(const pb::Message& header) {
  return static_cast<int64_t>(rpc::EncodeMessage(rpc::OutgoingMessage::Of(header)).Length());
}

TEST(StatsOverTheWireTest, ClientReportsTheConnectedWorkers) {
  const dist::PlacementPlan plan = Plan({{"w", {4}}}, 1);
  auto cluster = TestCluster::Start(1, 2);
  auto w0 = cluster->Client(plan, 0), w1 = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(w0->Connect());
  PSFLOW_ASSERT_OK(w1->Connect());
  auto stats = w0->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->size(), 1u);
  EXPECT_EQ((*stats)[0].connected_workers, 2);
  PSFLOW_ASSERT_OK(w1->Goodbye());
  stats = w0->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].connected_workers, 1);
  EXPECT_EQ((*stats)[0].connected_workers, cluster->servers[0]->Stats().connected_workers);
}

// Which workers are connected and which pushed: the chief names the missing ones and the summary
// counts the ones that pushed (train/worker_roster.h).
TEST(StatsOverTheWireTest, ClientReportsWhichWorkersAreConnectedAndWhichPushed) {
  const dist::PlacementPlan plan = Plan({{"w", {4}}}, 1);
  auto cluster = TestCluster::Start(1, 3);
  auto w0 = cluster->Client(plan, 0), w2 = cluster->Client(plan, 2);
  PSFLOW_ASSERT_OK(w0->Connect());
  PSFLOW_ASSERT_OK(w2->Connect());
  const Tensor w({4}, 1.0f), g({4}, 0.5f);
  PSFLOW_ASSERT_OK(w0->Initialize({{"w", &w}}, Sgd(0.1f)));
  auto stats = w0->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].connected_worker_indices, (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE((*stats)[0].pushed_worker_indices.empty());
  ASSERT_TRUE(w2->Push({{"w", &g, nullptr}}, 0).ok());
  ASSERT_TRUE(w2->Push({{"w", &g, nullptr}}, 1).ok());
  stats = w0->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].pushed_worker_indices, (std::vector<int32_t>{2}));
  PSFLOW_ASSERT_OK(w2->Goodbye());
  stats = w0->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].connected_worker_indices, (std::vector<int32_t>{0}));
  EXPECT_EQ((*stats)[0].pushed_worker_indices, (std::vector<int32_t>{2}));  // it did push
}

// The chief's traffic table (its final Stats call) and the ps's final counters differ by exactly
// what the Stats call's answer, and the Shutdown after it, carried: the ps's log line shows the
// table's numbers (ReportedStats) and that remainder apart.
TEST(StatsOverTheWireTest, ChiefsTrafficTableMatchesTheReportedStatsAndTheRestIsStatsAnswerAndShutdown) {
  const dist::PlacementPlan plan = Plan({{"w", {4}}}, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto chief = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(chief->Connect());
  const Tensor w({4}, 1.0f), g({4}, 0.5f);
  PSFLOW_ASSERT_OK(chief->Initialize({{"w", &w}}, Sgd(0.1f)));
  ASSERT_TRUE(chief->Push({{"w", &g, nullptr}}, 0).ok());
  PsServer& ps = *cluster->servers[0];
  EXPECT_FALSE(ps.ReportedStats().has_value());

  auto table = chief->Stats();
  ASSERT_TRUE(table.ok()) << table.status();
  const PsTaskStats& chiefs = (*table)[0];
  const std::optional<PsTaskStats> reported = ps.ReportedStats();
  ASSERT_TRUE(reported.has_value());
  EXPECT_EQ(reported->bytes_in, chiefs.bytes_in);
  EXPECT_EQ(reported->bytes_out, chiefs.bytes_out);
  // The answer carrying the stats cannot count itself.
  const int64_t stats_answer = EncodedBytes(ToWire(chiefs));
  EXPECT_EQ(ps.Stats().bytes_out - chiefs.bytes_out, stats_answer);
  EXPECT_EQ(ps.Stats().bytes_in, chiefs.bytes_in);  // its request was counted on arrival

  PSFLOW_ASSERT_OK(chief->Shutdown());
  const PsTaskStats after = ps.Stats();
  EXPECT_GT(after.bytes_in, chiefs.bytes_in);
  // Shutdown's request (a ShutdownRequest, whatever fields the client sets) in, and an Empty out.
  EXPECT_EQ(after.bytes_out - chiefs.bytes_out, stats_answer + EncodedBytes(wire::Empty()));
  EXPECT_EQ(ps.ReportedStats()->bytes_in, chiefs.bytes_in);  // unchanged by later calls
}

}  // namespace
}  // namespace psflow::ps
