// Every struct<->proto conversion of ps/common/wire_config.h round-trips every field, and cannot drift:
//   - proto -> struct -> proto with every field of the message (found by reflection, nested ones
//     included) set to a distinct non-default value: a field one direction forgets comes back
//     default, one that lands in another field comes back different;
//   - struct -> proto -> struct the same way, with the struct's fields taken by a structured
//     binding of their exact number: a field added to the struct stops this test compiling
//     until it is converted, and the message must have as many fields.
// Then what crosses them end to end over real gRPC: PsClient::Stats() reports the connected workers
// (it once reported 0), and the chief's traffic table against the ps's own
// final numbers.
#include "ps/common/wire_config.h"

#include <functional>
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
      for (int e = 0; e < 2; ++e) {
        const int v = ++*k;
        switch (f->cpp_type()) {
          case pb::FieldDescriptor::CPPTYPE_INT32:
            r->AddInt32(m, f, 100 + v);
            break;
          case pb::FieldDescriptor::CPPTYPE_INT64:
            r->AddInt64(m, f, (int64_t{1} << 40) + v);
            break;
          case pb::FieldDescriptor::CPPTYPE_FLOAT:
            r->AddFloat(m, f, 0.5f + v);
            break;
          case pb::FieldDescriptor::CPPTYPE_STRING:
            r->AddString(m, f, "value" + std::to_string(v));
            break;
          case pb::FieldDescriptor::CPPTYPE_MESSAGE:
            FillDistinct(r->AddMessage(m, f), k);
            break;
          default:
            FAIL() << f->full_name() << ": extend FillDistinct for repeated fields of its type";
        }
      }
      continue;
    }
    const int v = ++*k;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, 100 + v);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, (int64_t{1} << 40) + v);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, 100 + v);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, (uint64_t{1} << 40) + v);
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(m, f, 0.5f + v);
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, 0.25 + v);
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, true);
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, "value" + std::to_string(v));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        FillDistinct(r->MutableMessage(m, f), k);
        break;
      default:
        FAIL() << f->full_name() << ": extend FillDistinct for its type";
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
void Set(std::vector<int64_t>& x, int v) { x = {int64_t{1} << 40, v}; }
void Set(std::vector<float>& x, int v) { x = {0.5f, 0.25f + v}; }
void Set(std::vector<optim::ParameterGroup>& x, int v) {
  x = {optim::ParameterGroup{{"a", "b" + std::to_string(v)}, 0.5f + v, 2.0f, std::nullopt},
       optim::ParameterGroup{{"c"}, std::nullopt, 1.5f, 0.25f + v}};
}

// The enum-like strings of a filled TableConfig as names FromWire reads (variant v: each choice).
void MakeReadable(wire::TableConfig* t, int v) {
  t->set_strategy(v == 0 ? "div" : "mod");
  t->mutable_initializer()->set_kind(v == 0 ? "uniform" : "truncated_normal");
  t->set_storage(v == 0 ? "memory" : "disk");
}

TEST(WireConfigTest, TrainingConfigFromTheWireAndBack) {
  // A table's strategy must be one FromWire parses: fill, then name a real one.
  wire::TrainingConfig w;
  int k = 0;
  FillDistinct(&w, &k);
  // Its strategy, initializer kind and storage are names FromWire reads: fill, then name real ones.
  MakeReadable(w.mutable_tables(0), 0);
  MakeReadable(w.mutable_tables(1), 1);
  w.set_table_sync("async");  // "sync" is sent as unset
  const absl::StatusOr<TrainingConfig> read = FromWire(w);
  ASSERT_TRUE(read.ok()) << read.status();
  const wire::TrainingConfig back = ToWire(*read);
  std::string diff;
  pb::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(w, back)) << diff;
}

TEST(WireConfigTest, TableConfigFromTheWireAndBackKeepsEveryField) {
  for (int v = 0; v < 2; ++v) {
    wire::TableConfig w;
    int k = 0;
    FillDistinct(&w, &k);
    MakeReadable(&w, v);
    const absl::StatusOr<TableDeclaration> d = FromWire(w);
    ASSERT_TRUE(d.ok()) << d.status();
    const wire::TableConfig back = ToWire(*d);
    std::string diff;
    pb::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differ.Compare(w, back)) << diff;
  }
}

// A declaration the ps cannot read is refused, naming the table and the field, never turned into
// a default one (FromWire of the whole config once kept a default declaration in its place).
TEST(WireConfigTest, ATableConfigItCannotReadIsRefusedNamingTheTableAndTheField) {
  const auto good = [] {
    wire::TableConfig t;
    t.set_name("emb");
    t.set_dim(4);
    t.set_num_embeddings(10);
    t.set_num_shards(1);
    t.set_strategy("div");
    t.mutable_initializer()->set_kind("zeros");
    t.set_evict_every(100);
    t.set_storage("memory");
    return t;
  };
  ASSERT_TRUE(FromWire(good()).ok()) << FromWire(good()).status();
  struct Case {
    const char* field;
    std::function<void(wire::TableConfig*)> spoil;
  };
  const Case cases[] = {
      {"strategy", [](wire::TableConfig* t) { t->set_strategy("hash"); }},
      {"initializer", [](wire::TableConfig* t) { t->mutable_initializer()->set_kind("gaussian"); }},
      {"initializer", [](wire::TableConfig* t) { t->clear_initializer(); }},
      {"storage", [](wire::TableConfig* t) { t->set_storage("tape"); }},
      {"storage", [](wire::TableConfig* t) { t->clear_storage(); }},
  };
  for (const Case& c : cases) {
    wire::TableConfig t = good();
    c.spoil(&t);
    const absl::StatusOr<TableDeclaration> d = FromWire(t);
    ASSERT_FALSE(d.ok()) << c.field;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("table 'emb'"));
    EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr(c.field));
    // In a whole config: the config is refused, not read with a default table in its place.
    wire::TrainingConfig config;
    *config.add_tables() = good();
    *config.add_tables() = t;
    const absl::StatusOr<TrainingConfig> read = FromWire(config);
    ASSERT_FALSE(read.ok()) << c.field;
    EXPECT_THAT(std::string(read.status().message()), ::testing::HasSubstr("table 'emb'"));
  }
}

TEST(WireConfigTest, StatsFromTheWireAndBack) { ExpectProtoRoundTrip<wire::StatsResponse>(); }

TEST(WireConfigTest, TrainingConfigToTheWireAndBackKeepsEveryField) {
  TrainingConfig c;
  // Exactly the struct's fields: adding one breaks this line until it is converted and listed.
  auto& [optimizer, sync, replicas, total, train_steps, timeout, initial_step, tables, sparse_optimizer, ftrl_l1,
         ftrl_l2, sparse_sync_mean, sparse_learning_rate, wire_dtype, table_sync, staleness_aware_lr] = c;
  auto& [name, convention, lr, momentum, nesterov, init_acc, adagrad_eps, beta1, beta2, adam_eps, rms_decay,
         rms_momentum, rms_eps, weight_decay, groups, schedule, decay_steps, decay_rate, staircase, cosine_steps,
         min_lr, boundaries, values, warmup_steps, warmup_start] = optimizer;
  EXPECT_EQ(wire::TrainingConfig::descriptor()->field_count(), 16);
  EXPECT_EQ(wire::TableConfig::descriptor()->field_count(), 13);  // the lifecycle and initializer flattened
  EXPECT_EQ(wire::TableInitializer::descriptor()->field_count(), 7);
  EXPECT_EQ(wire::OptimizerConfig::descriptor()->field_count(), 25);
  int k = 0;
  Set(name, ++k), Set(convention, ++k), Set(lr, ++k), Set(momentum, ++k), Set(nesterov, ++k), Set(init_acc, ++k);
  Set(adagrad_eps, ++k), Set(beta1, ++k), Set(beta2, ++k), Set(adam_eps, ++k), Set(rms_decay, ++k);
  Set(rms_momentum, ++k), Set(rms_eps, ++k), Set(weight_decay, ++k), Set(groups, ++k), Set(schedule, ++k);
  Set(decay_steps, ++k), Set(decay_rate, ++k), Set(staircase, ++k), Set(cosine_steps, ++k), Set(min_lr, ++k);
  Set(boundaries, ++k), Set(values, ++k), Set(warmup_steps, ++k), Set(warmup_start, ++k);
  Set(sync, ++k), Set(replicas, ++k), Set(total, ++k), Set(train_steps, ++k), Set(timeout, ++k);
  Set(initial_step, ++k);
  Set(sparse_optimizer, ++k), Set(ftrl_l1, ++k), Set(ftrl_l2, ++k), Set(sparse_sync_mean, ++k),
      Set(sparse_learning_rate, ++k);
  Set(wire_dtype, ++k);
  table_sync = "async";
  staleness_aware_lr = true;
  for (int t = 0; t < 2; ++t) {
    TableDeclaration& d = tables.emplace_back();
    auto& [spec, num_shards] = d;
    auto& [name_t, kind, dim, num_embeddings, strategy, initializer, lifecycle, rule, storage] = spec;
    auto& [init_kind, value, minval, maxval, mean, stddev, seed] = initializer;
    auto& [admit_after, steps_to_live, max_rows, evict_every] = lifecycle;
    Set(name_t, ++k), kind = t == 1 ? dist::TableKind::kDynamic : dist::TableKind::kFixed, Set(dim, ++k);
    Set(num_embeddings, ++k);
    strategy = t == 0 ? dist::TableStrategy::kMod : dist::TableStrategy::kDiv;
    init_kind = t == 0 ? dist::InitKind::kUniform : dist::InitKind::kNormal;
    Set(value, ++k), Set(minval, ++k), Set(maxval, ++k), Set(mean, ++k), Set(stddev, ++k);
    seed = (uint64_t{1} << 63) + static_cast<uint64_t>(++k);
    Set(admit_after, ++k), Set(steps_to_live, ++k), Set(max_rows, ++k), Set(evict_every, ++k), Set(rule, ++k);
    storage = t == 0 ? dist::TableStorage::kDisk : dist::TableStorage::kMemory;
    Set(num_shards, ++k);
  }

  const absl::StatusOr<TrainingConfig> read = FromWire(ToWire(c));
  ASSERT_TRUE(read.ok()) << read.status();
  const TrainingConfig& back = *read;
  const auto& [b_optimizer, b_sync, b_replicas, b_total, b_train_steps, b_timeout, b_initial_step, b_tables,
               b_sparse_optimizer, b_ftrl_l1, b_ftrl_l2, b_sparse_sync_mean, b_sparse_learning_rate, b_wire_dtype,
               b_table_sync, b_staleness_aware_lr] =
      back;
  EXPECT_EQ(b_tables, tables);
  EXPECT_EQ(b_sparse_optimizer, sparse_optimizer);
  EXPECT_EQ(b_ftrl_l1, ftrl_l1);
  EXPECT_EQ(b_ftrl_l2, ftrl_l2);
  EXPECT_EQ(b_sparse_sync_mean, sparse_sync_mean);
  EXPECT_EQ(b_sparse_learning_rate, sparse_learning_rate);
  EXPECT_EQ(b_wire_dtype, wire_dtype);
  EXPECT_EQ(b_table_sync, table_sync);
  EXPECT_EQ(b_staleness_aware_lr, staleness_aware_lr);
  const auto& [b_name, b_convention, b_lr, b_momentum, b_nesterov, b_init_acc, b_adagrad_eps, b_beta1, b_beta2,
               b_adam_eps, b_rms_decay, b_rms_momentum, b_rms_eps, b_weight_decay, b_groups, b_schedule, b_decay_steps,
               b_decay_rate, b_staircase, b_cosine_steps, b_min_lr, b_boundaries, b_values, b_warmup_steps,
               b_warmup_start] = b_optimizer;
  EXPECT_EQ(b_name, name);
  EXPECT_EQ(b_convention, convention);
  EXPECT_EQ(b_lr, lr);
  EXPECT_EQ(b_momentum, momentum);
  EXPECT_EQ(b_nesterov, nesterov);
  EXPECT_EQ(b_init_acc, init_acc);
  EXPECT_EQ(b_adagrad_eps, adagrad_eps);
  EXPECT_EQ(b_beta1, beta1);
  EXPECT_EQ(b_beta2, beta2);
  EXPECT_EQ(b_adam_eps, adam_eps);
  EXPECT_EQ(b_rms_decay, rms_decay);
  EXPECT_EQ(b_rms_momentum, rms_momentum);
  EXPECT_EQ(b_rms_eps, rms_eps);
  EXPECT_EQ(b_weight_decay, weight_decay);
  EXPECT_TRUE(b_groups == groups);
  EXPECT_EQ(b_schedule, schedule);
  EXPECT_EQ(b_decay_steps, decay_steps);
  EXPECT_EQ(b_decay_rate, decay_rate);
  EXPECT_EQ(b_staircase, staircase);
  EXPECT_EQ(b_cosine_steps, cosine_steps);
  EXPECT_EQ(b_min_lr, min_lr);
  EXPECT_EQ(b_boundaries, boundaries);
  EXPECT_EQ(b_values, values);
  EXPECT_EQ(b_warmup_steps, warmup_steps);
  EXPECT_EQ(b_warmup_start, warmup_start);
  EXPECT_EQ(b_sync, sync);
  EXPECT_EQ(b_replicas, replicas);
  EXPECT_EQ(b_total, total);
  EXPECT_EQ(b_train_steps, train_steps);
  EXPECT_EQ(b_timeout, timeout);
  EXPECT_EQ(b_initial_step, initial_step);
}

TEST(WireConfigTest, StatsToTheWireAndBackKeepsEveryField) {
  PsTaskStats s;
  auto& [task, bytes_in, bytes_out, num_params, global_step, stale, refused, unauthenticated, connected, tables,
         connected_indices, pushed_indices, staleness_counts] = s;
  EXPECT_EQ(wire::StatsResponse::descriptor()->field_count(), 13);
  EXPECT_EQ(wire::TableStatsWire::descriptor()->field_count(), 15);
  int k = 0;
  Set(task, ++k), Set(bytes_in, ++k), Set(bytes_out, ++k), Set(num_params, ++k), Set(global_step, ++k);
  Set(stale, ++k), Set(refused, ++k), Set(unauthenticated, ++k), Set(connected, ++k);
  auto& [table, rows, pending, bytes, admissions, evictions, pulled, pushed, dropped, storage, hits, misses, disk_bytes,
         disk_read, disk_written] = tables.emplace_back();
  Set(table, ++k), Set(rows, ++k), Set(pending, ++k), Set(bytes, ++k), Set(admissions, ++k), Set(evictions, ++k);
  Set(pulled, ++k), Set(pushed, ++k), Set(dropped, ++k), Set(storage, ++k), Set(hits, ++k), Set(misses, ++k);
  Set(disk_bytes, ++k), Set(disk_read, ++k), Set(disk_written, ++k);
  connected_indices = {0, 2, 5};
  pushed_indices = {1, 2};
  staleness_counts = {7, 0, int64_t{1} << 40};
  const PsTaskStats back = FromWire(ToWire(s));
  const auto& [b_task, b_bytes_in, b_bytes_out, b_num_params, b_global_step, b_stale, b_refused, b_unauthenticated,
               b_connected, b_tables, b_connected_indices, b_pushed_indices, b_staleness_counts] = back;
  EXPECT_EQ(b_staleness_counts, staleness_counts);
  ASSERT_EQ(b_tables.size(), 1u);
  const auto& [b_table, b_rows, b_pending, b_bytes, b_admissions, b_evictions, b_pulled, b_pushed, b_dropped, b_storage,
               b_hits, b_misses, b_disk_bytes, b_disk_read, b_disk_written] = b_tables[0];
  EXPECT_EQ(b_storage, storage);
  EXPECT_EQ(b_hits, hits);
  EXPECT_EQ(b_misses, misses);
  EXPECT_EQ(b_disk_bytes, disk_bytes);
  EXPECT_EQ(b_disk_read, disk_read);
  EXPECT_EQ(b_disk_written, disk_written);
  EXPECT_EQ(b_table, table);
  EXPECT_EQ(b_rows, rows);
  EXPECT_EQ(b_pending, pending);
  EXPECT_EQ(b_bytes, bytes);
  EXPECT_EQ(b_admissions, admissions);
  EXPECT_EQ(b_evictions, evictions);
  EXPECT_EQ(b_pulled, pulled);
  EXPECT_EQ(b_pushed, pushed);
  EXPECT_EQ(b_dropped, dropped);
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
