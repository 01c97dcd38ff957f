#include "ps/common/wire_config.h"

namespace psflow::ps {

wire::TrainingConfig ToWire(const TrainingConfig& c) {
  wire::TrainingConfig w;
  wire::OptimizerConfig* o = w.mutable_optimizer();
  o->set_name(c.optimizer.name);
  o->set_learning_rate(c.optimizer.learning_rate);
  o->set_momentum(c.optimizer.momentum);
  o->set_initial_accumulator(c.optimizer.initial_accumulator);
  o->set_beta1(c.optimizer.beta1);
  o->set_beta2(c.optimizer.beta2);
  o->set_adam_epsilon(c.optimizer.adam_epsilon);
  o->set_rms_decay(c.optimizer.rms_decay);
  o->set_rms_momentum(c.optimizer.rms_momentum);
  o->set_rms_epsilon(c.optimizer.rms_epsilon);
  o->set_decay_steps(c.optimizer.decay_steps);
  o->set_decay_rate(c.optimizer.decay_rate);
  o->set_staircase(c.optimizer.staircase);
  o->set_convention(c.optimizer.convention);
  o->set_nesterov(c.optimizer.nesterov);
  o->set_adagrad_epsilon(c.optimizer.adagrad_epsilon);
  o->set_weight_decay(c.optimizer.weight_decay);
  for (const optim::ParameterGroup& g : c.optimizer.groups) {
    wire::ParameterGroup* wg = o->add_groups();
    for (const std::string& v : g.variables) wg->add_variables(v);
    if (g.learning_rate.has_value()) wg->set_learning_rate(*g.learning_rate);
    wg->set_lr_scale(g.lr_scale);
    if (g.weight_decay.has_value()) wg->set_weight_decay(*g.weight_decay);
  }
  o->set_schedule(c.optimizer.schedule);
  o->set_cosine_steps(c.optimizer.cosine_steps);
  o->set_min_learning_rate(c.optimizer.min_learning_rate);
  for (int64_t b : c.optimizer.boundaries) o->add_boundaries(b);
  for (float v : c.optimizer.values) o->add_values(v);
  o->set_warmup_steps(c.optimizer.warmup_steps);
  o->set_warmup_start_factor(c.optimizer.warmup_start_factor);
  w.set_sync(c.sync);
  w.set_replicas_to_aggregate(c.replicas_to_aggregate);
  w.set_total_num_replicas(c.total_num_replicas);
  w.set_train_steps(c.train_steps);
  w.set_sync_timeout_secs(c.sync_timeout_secs);
  w.set_initial_global_step(c.initial_global_step);
  return w;
}

TrainingConfig FromWire(const wire::TrainingConfig& w) {
  TrainingConfig c;
  const wire::OptimizerConfig& o = w.optimizer();
  c.optimizer.name = o.name();
  c.optimizer.learning_rate = o.learning_rate();
  c.optimizer.momentum = o.momentum();
  c.optimizer.initial_accumulator = o.initial_accumulator();
  c.optimizer.beta1 = o.beta1();
  c.optimizer.beta2 = o.beta2();
  c.optimizer.adam_epsilon = o.adam_epsilon();
  c.optimizer.rms_decay = o.rms_decay();
  c.optimizer.rms_momentum = o.rms_momentum();
  c.optimizer.rms_epsilon = o.rms_epsilon();
  c.optimizer.decay_steps = o.decay_steps();
  c.optimizer.decay_rate = o.decay_rate();
  c.optimizer.staircase = o.staircase();
  if (!o.convention().empty()) c.optimizer.convention = o.convention();
  c.optimizer.nesterov = o.nesterov();
  c.optimizer.adagrad_epsilon = o.adagrad_epsilon();
  c.optimizer.weight_decay = o.weight_decay();
  for (const wire::ParameterGroup& wg : o.groups()) {
    optim::ParameterGroup& g = c.optimizer.groups.emplace_back();
    g.variables.assign(wg.variables().begin(), wg.variables().end());
    if (wg.has_learning_rate()) g.learning_rate = wg.learning_rate();
    g.lr_scale = wg.lr_scale();
    if (wg.has_weight_decay()) g.weight_decay = wg.weight_decay();
  }
  if (!o.schedule().empty()) c.optimizer.schedule = o.schedule();
  c.optimizer.cosine_steps = o.cosine_steps();
  c.optimizer.min_learning_rate = o.min_learning_rate();
  c.optimizer.boundaries.assign(o.boundaries().begin(), o.boundaries().end());
  c.optimizer.values.assign(o.values().begin(), o.values().end());
  c.optimizer.warmup_steps = o.warmup_steps();
  c.optimizer.warmup_start_factor = o.warmup_start_factor();
  c.sync = w.sync();
  c.replicas_to_aggregate = w.replicas_to_aggregate();
  c.total_num_replicas = w.total_num_replicas();
  c.train_steps = w.train_steps();
  c.sync_timeout_secs = w.sync_timeout_secs();
  c.initial_global_step = w.initial_global_step();
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
  return s;
}

}  // namespace psflow::ps
