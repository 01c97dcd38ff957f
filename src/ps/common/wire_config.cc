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
  for (int32_t i : s.connected_worker_indices) w.add_connected_worker_indices(i);
  for (int32_t i : s.pushed_worker_indices) w.add_pushed_worker_indices(i);
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
  s.connected_worker_indices.assign(w.connected_worker_indices().begin(), w.connected_worker_indices().end());
  s.pushed_worker_indices.assign(w.pushed_worker_indices().begin(), w.pushed_worker_indices().end());
  return s;
}

}  // namespace psflow::ps
