#include "ps/common/wire_config.h"

#include "absl/strings/str_cat.h"

namespace psflow::ps {
namespace {

void OptimizerToWire(const optim::OptimizerConfig& c, wire::OptimizerConfig* o) {
  o->set_name(c.name);
  o->set_learning_rate(c.learning_rate);
  o->set_momentum(c.momentum);
  o->set_initial_accumulator(c.initial_accumulator);
  o->set_beta1(c.beta1);
  o->set_beta2(c.beta2);
  o->set_adam_epsilon(c.adam_epsilon);
  o->set_rms_decay(c.rms_decay);
  o->set_rms_momentum(c.rms_momentum);
  o->set_rms_epsilon(c.rms_epsilon);
  o->set_decay_steps(c.decay_steps);
  o->set_decay_rate(c.decay_rate);
  o->set_staircase(c.staircase);
  o->set_convention(c.convention);
  o->set_nesterov(c.nesterov);
  o->set_adagrad_epsilon(c.adagrad_epsilon);
  o->set_weight_decay(c.weight_decay);
  for (const optim::ParameterGroup& g : c.groups) {
    wire::ParameterGroup* wg = o->add_groups();
    for (const std::string& v : g.variables) wg->add_variables(v);
    if (g.learning_rate.has_value()) wg->set_learning_rate(*g.learning_rate);
    wg->set_lr_scale(g.lr_scale);
    if (g.weight_decay.has_value()) wg->set_weight_decay(*g.weight_decay);
  }
  o->set_schedule(c.schedule);
  o->set_cosine_steps(c.cosine_steps);
  o->set_min_learning_rate(c.min_learning_rate);
  for (int64_t b : c.boundaries) o->add_boundaries(b);
  for (float v : c.values) o->add_values(v);
  o->set_warmup_steps(c.warmup_steps);
  o->set_warmup_start_factor(c.warmup_start_factor);
}

optim::OptimizerConfig OptimizerFromWire(const wire::OptimizerConfig& o) {
  optim::OptimizerConfig c;
  c.name = o.name();
  c.learning_rate = o.learning_rate();
  c.momentum = o.momentum();
  c.initial_accumulator = o.initial_accumulator();
  c.beta1 = o.beta1();
  c.beta2 = o.beta2();
  c.adam_epsilon = o.adam_epsilon();
  c.rms_decay = o.rms_decay();
  c.rms_momentum = o.rms_momentum();
  c.rms_epsilon = o.rms_epsilon();
  c.decay_steps = o.decay_steps();
  c.decay_rate = o.decay_rate();
  c.staircase = o.staircase();
  if (!o.convention().empty()) c.convention = o.convention();
  c.nesterov = o.nesterov();
  c.adagrad_epsilon = o.adagrad_epsilon();
  c.weight_decay = o.weight_decay();
  for (const wire::ParameterGroup& wg : o.groups()) {
    optim::ParameterGroup& g = c.groups.emplace_back();
    g.variables.assign(wg.variables().begin(), wg.variables().end());
    if (wg.has_learning_rate()) g.learning_rate = wg.learning_rate();
    g.lr_scale = wg.lr_scale();
    if (wg.has_weight_decay()) g.weight_decay = wg.weight_decay();
  }
  if (!o.schedule().empty()) c.schedule = o.schedule();
  c.cosine_steps = o.cosine_steps();
  c.min_learning_rate = o.min_learning_rate();
  c.boundaries.assign(o.boundaries().begin(), o.boundaries().end());
  c.values.assign(o.values().begin(), o.values().end());
  c.warmup_steps = o.warmup_steps();
  c.warmup_start_factor = o.warmup_start_factor();
  return c;
}

}  // namespace

wire::TableConfig ToWire(const TableDeclaration& d) {
  wire::TableConfig w;
  const dist::TableSpec& t = d.spec;
  w.set_name(t.name);
  w.set_dim(t.dim);
  w.set_dynamic(t.dynamic());
  w.set_num_embeddings(t.num_embeddings);
  w.set_num_shards(d.num_shards);
  w.set_strategy(std::string(dist::TableStrategyName(t.strategy)));
  wire::TableInitializer* init = w.mutable_initializer();
  init->set_kind(std::string(dist::InitKindName(t.initializer.kind)));
  init->set_value(t.initializer.value);
  init->set_minval(t.initializer.minval);
  init->set_maxval(t.initializer.maxval);
  init->set_mean(t.initializer.mean);
  init->set_stddev(t.initializer.stddev);
  init->set_seed(t.initializer.seed);
  w.set_admit_after(t.lifecycle.admit_after);
  w.set_steps_to_live(t.lifecycle.steps_to_live);
  w.set_max_rows(t.lifecycle.max_rows);
  w.set_evict_every(t.lifecycle.evict_every);
  w.set_sparse_optimizer(t.sparse_optimizer);
  w.set_storage(std::string(dist::TableStorageName(t.storage)));
  return w;
}

absl::StatusOr<TableDeclaration> FromWire(const wire::TableConfig& w) {
  const auto bad = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("table '", w.name(), "': ", field, ": ", why));
  };
  TableDeclaration d;
  dist::TableSpec& t = d.spec;
  t.name = w.name();
  t.dim = w.dim();
  t.kind = w.dynamic() ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
  t.num_embeddings = w.num_embeddings();
  d.num_shards = w.num_shards();
  absl::StatusOr<dist::TableStrategy> strategy = dist::ParseTableStrategy(w.strategy());
  if (!strategy.ok()) return bad("strategy", strategy.status().message());
  t.strategy = *strategy;
  if (!w.has_initializer()) return bad("initializer", "missing (a declaration always carries one)");
  const wire::TableInitializer& init = w.initializer();
  absl::StatusOr<dist::InitKind> kind = dist::ParseInitKind(init.kind());
  if (!kind.ok()) return bad("initializer", kind.status().message());
  t.initializer = {.kind = *kind,
                   .value = init.value(),
                   .minval = init.minval(),
                   .maxval = init.maxval(),
                   .mean = init.mean(),
                   .stddev = init.stddev(),
                   .seed = init.seed()};
  t.lifecycle = {.admit_after = w.admit_after(),
                 .steps_to_live = w.steps_to_live(),
                 .max_rows = w.max_rows(),
                 .evict_every = w.evict_every()};
  t.sparse_optimizer = w.sparse_optimizer();
  absl::StatusOr<dist::TableStorage> storage = dist::ParseTableStorage(w.storage());
  if (!storage.ok()) return bad("storage", storage.status().message());
  t.storage = *storage;
  return d;
}

wire::TrainingConfig ToWire(const TrainingConfig& c) {
  wire::TrainingConfig w;
  OptimizerToWire(c.optimizer, w.mutable_optimizer());
  w.set_sync(c.sync);
  w.set_replicas_to_aggregate(c.replicas_to_aggregate);
  w.set_total_num_replicas(c.total_num_replicas);
  w.set_train_steps(c.train_steps);
  w.set_sync_timeout_secs(c.sync_timeout_secs);
  w.set_initial_global_step(c.initial_global_step);
  for (const TableDeclaration& t : c.tables) *w.add_tables() = ToWire(t);
  w.set_sparse_optimizer(c.sparse_optimizer);
  w.set_ftrl_l1(c.ftrl_l1);
  w.set_ftrl_l2(c.ftrl_l2);
  w.set_sparse_sync_mean(c.sparse_sync_mean);
  w.set_sparse_learning_rate(c.sparse_learning_rate);
  if (c.wire_dtype != "float32") w.set_wire_dtype(c.wire_dtype);  // unset: float32, as before the field
  if (c.table_sync != "sync") w.set_table_sync(c.table_sync);
  w.set_staleness_aware_lr(c.staleness_aware_lr);
  return w;
}

absl::StatusOr<TrainingConfig> FromWire(const wire::TrainingConfig& w) {
  TrainingConfig c;
  c.optimizer = OptimizerFromWire(w.optimizer());
  c.sync = w.sync();
  c.replicas_to_aggregate = w.replicas_to_aggregate();
  c.total_num_replicas = w.total_num_replicas();
  c.train_steps = w.train_steps();
  c.sync_timeout_secs = w.sync_timeout_secs();
  c.initial_global_step = w.initial_global_step();
  for (const wire::TableConfig& t : w.tables()) {
    absl::StatusOr<TableDeclaration> d = FromWire(t);
    if (!d.ok()) return d.status();
    c.tables.push_back(*std::move(d));
  }
  c.sparse_optimizer = w.sparse_optimizer();
  c.ftrl_l1 = w.ftrl_l1();
  c.ftrl_l2 = w.ftrl_l2();
  c.sparse_sync_mean = w.sparse_sync_mean();
  c.sparse_learning_rate = w.sparse_learning_rate();
  c.wire_dtype = w.wire_dtype().empty() ? "float32" : w.wire_dtype();
  c.table_sync = w.table_sync().empty() ? "sync" : w.table_sync();
  if (c.table_sync != "sync" && c.table_sync != "async") {
    return absl::InvalidArgumentError(absl::StrCat("table_sync '", c.table_sync, "' is not sync or async"));
  }
  c.staleness_aware_lr = w.staleness_aware_lr();
  return c;
}

wire::StatsResponse ToWire(const PsTaskStats& s) {
  wire::StatsResponse w;
  w.set_task(s.task);
  w.set_bytes_in(s.bytes_in);
  w.set_bytes_out(s.bytes_out);
  w.set_num_params(s.num_params);
  w.set_global_step(s.global_step);
  w.set_stale_gradients_dropped(s.stale_gradients_dropped);
  w.set_pushes_refused(s.pushes_refused);
  w.set_calls_unauthenticated(s.calls_unauthenticated);
  w.set_connected_workers(s.connected_workers);
  for (const TableTaskStats& t : s.tables) {
    wire::TableStatsWire* o = w.add_tables();
    o->set_table(t.table);
    o->set_rows(t.rows);
    o->set_pending_ids(t.pending_ids);
    o->set_bytes(t.bytes);
    o->set_admissions(t.admissions);
    o->set_evictions(t.evictions);
    o->set_rows_pulled(t.rows_pulled);
    o->set_rows_pushed(t.rows_pushed);
    o->set_rows_dropped(t.rows_dropped);
    o->set_storage(t.storage);
    o->set_cache_hits(t.cache_hits);
    o->set_cache_misses(t.cache_misses);
    o->set_disk_bytes(t.disk_bytes);
    o->set_disk_rows_read(t.disk_rows_read);
    o->set_disk_rows_written(t.disk_rows_written);
  }
  for (int32_t i : s.connected_worker_indices) w.add_connected_worker_indices(i);
  for (int32_t i : s.pushed_worker_indices) w.add_pushed_worker_indices(i);
  for (int64_t n : s.staleness_counts) w.add_staleness_counts(n);
  return w;
}

PsTaskStats FromWire(const wire::StatsResponse& w) {
  PsTaskStats s;
  s.task = w.task();
  s.bytes_in = w.bytes_in();
  s.bytes_out = w.bytes_out();
  s.num_params = w.num_params();
  s.global_step = w.global_step();
  s.stale_gradients_dropped = w.stale_gradients_dropped();
  s.pushes_refused = w.pushes_refused();
  s.calls_unauthenticated = w.calls_unauthenticated();
  s.connected_workers = w.connected_workers();
  for (const wire::TableStatsWire& o : w.tables()) {
    s.tables.push_back({.table = o.table(),
                        .rows = o.rows(),
                        .pending_ids = o.pending_ids(),
                        .bytes = o.bytes(),
                        .admissions = o.admissions(),
                        .evictions = o.evictions(),
                        .rows_pulled = o.rows_pulled(),
                        .rows_pushed = o.rows_pushed(),
                        .rows_dropped = o.rows_dropped(),
                        .storage = o.storage().empty() ? "memory" : o.storage(),
                        .cache_hits = o.cache_hits(),
                        .cache_misses = o.cache_misses(),
                        .disk_bytes = o.disk_bytes(),
                        .disk_rows_read = o.disk_rows_read(),
                        .disk_rows_written = o.disk_rows_written()});
  }
  s.connected_worker_indices.assign(w.connected_worker_indices().begin(), w.connected_worker_indices().end());
  s.pushed_worker_indices.assign(w.pushed_worker_indices().begin(), w.pushed_worker_indices().end());
  s.staleness_counts.assign(w.staleness_counts().begin(), w.staleness_counts().end());
  return s;
}

}  // namespace psflow::ps
