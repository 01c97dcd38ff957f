// The chief's restore of a ps task that restarted empty, against real ps servers over gRPC on
// loopback: with checkpoints every ps task goes back to the newest one (values, optimizer slots,
// global step); before the first checkpoint the job starts over from the initializers' values (not
// from what the chief pulled since) — for a caller's own initialization too (the values its buffers
// held, copied by the Chief); without --checkpoint_dir only that task's variables start over;
// another ps task down during the restore is waited for; and a sync push held by a ps task that
// is being restored is answered so that its worker waits for the chief and pulls again. A scheduled
// save runs beside training: the chief steps on while it writes, at most one is in flight, a failed
// one is logged and tried again, and the final save waits for the one in flight.
#include "train/chief.h"

#include <filesystem>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "io/fault_injection_env.h"
#include "ps/tests/ps_test_util.h"
#include "psflow/nn/model.h"
#include "train/cluster_setup.h"

namespace psflow::train {
namespace {

using ps::testing::TestCluster;

struct ChiefFixture {
  TrainOptions options;
  std::unique_ptr<TestCluster> cluster;
  std::unique_ptr<nn::Model> model;
  dist::PlacementPlan plan;
  ps::TrainingConfig config;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<ps::PsClient> client;
  std::vector<std::string> log;
  LogSink sink = [this](const std::string& line) { log.push_back(line); };
  std::unique_ptr<Chief> chief;
  // A caller-owned model (the Python binding's case): its values differ from the seed's, and the
  // Chief keeps the copy made at construction rather than rebuilding the model.
  bool own_initialization = false;

  // 2 ps tasks, every variable split across both (fixed:2), Adam; `checkpoint_dir` may be empty.
  // Options set before Start are kept unless Start sets them.
  void Start(const std::string& checkpoint_dir, bool sync = false) {
    options.model = "mlp";
    options.hidden_units = 8;
    options.seed = 7;
    options.optimizer = "adam";
    options.learning_rate = 0.05f;
    options.lr_decay_steps = 0;
    options.lr_decay_rate = 1;
    options.train_steps = 1000;
    options.partitioner = "fixed:2";
    options.checkpoint_dir = checkpoint_dir;
    options.sync_replicas = sync;
    options.sync_timeout_secs = 60;
    cluster = TestCluster::Start(2, 2);
    ASSERT_NE(cluster, nullptr);
    auto built = nn::BuildModel({options.model, options.hidden_units, options.seed});
    ASSERT_TRUE(built.ok()) << built.status();
    model = *std::move(built);
    auto planned = PlanFor(*model, options, 2);
    ASSERT_TRUE(planned.ok()) << planned.status();
    plan = *planned;
    auto cfg = TrainingConfigFor(options, 2);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config = *cfg;
    auto opt = optim::MakeOptimizer(config.optimizer);
    ASSERT_TRUE(opt.ok()) << opt.status();
    optimizer = *std::move(opt);
    client = cluster->Client(plan, 0, {}, sink);
    ASSERT_NE(client, nullptr);
    PSFLOW_ASSERT_OK(client->Connect());
    Chief::InitialValues initial;
    for (const Var& p : model->parameters()) {
      if (own_initialization) p->value[0] += 0.5f;
      initial.at_start.push_back(&p->value);
    }
    // Otherwise the initial values are rebuilt from the seed, as `psflow train`'s worker does.
    if (!own_initialization)
      initial.rebuild = [this]() -> absl::StatusOr<std::vector<Tensor>> {
        auto fresh = nn::BuildModel({options.model, options.hidden_units, options.seed});
        if (!fresh.ok()) return fresh.status();
        std::vector<Tensor> values;
        for (const Var& p : (*fresh)->parameters()) values.push_back(p->value);
        return values;
      };
    chief = std::make_unique<Chief>(options, options.model, *client, VariableSpecsOf(model->parameters()),
                                    std::move(initial), config, *optimizer, sink);
    PSFLOW_ASSERT_OK(chief->InitializeCluster());
  }

  std::vector<std::pair<std::string, Tensor*>> PullTargets() {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (const Var& p : model->parameters()) out.emplace_back(p->name, &p->value);
    return out;
  }

  // One Adam step with a gradient that differs per step and per element.
  void Step(int64_t tag) {
    std::vector<Tensor> grads;
    for (const Var& p : model->parameters()) {
      Tensor g(p->value.shape());
      for (int64_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>((i % 7) - 3 + tag);
      grads.push_back(std::move(g));
    }
    std::vector<ps::Gradient> pushed;
    for (size_t i = 0; i < grads.size(); ++i) pushed.push_back({model->parameters()[i]->name, &grads[i], nullptr});
    auto result = client->PushAndPull(pushed, tag, PullTargets());
    ASSERT_TRUE(result.ok()) << result.status();
  }

  std::vector<Tensor> Values() {
    std::vector<Tensor> values;
    for (const Var& p : model->parameters()) values.push_back(p->value);
    return values;
  }
};

void ExpectSameValues(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t v = 0; v < a.size(); ++v) {
    ASSERT_EQ(a[v].shape(), b[v].shape());
    for (int64_t i = 0; i < a[v].size(); ++i)
      ASSERT_EQ(a[v][i], b[v][i]) << what << ": variable " << v << " element " << i;
  }
}

std::string FreshDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(ChiefRestoreTest, EveryPsTaskGoesBackToTheNewestCheckpoint) {
  ChiefFixture f;
  ASSERT_NO_FATAL_FAILURE(f.Start(FreshDir("chief_restore_ckpt")));
  for (int64_t step = 0; step < 3; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  PSFLOW_ASSERT_OK(f.chief->SaveCheckpoint());
  auto saved = f.client->PullState();
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::vector<Tensor> at_checkpoint = f.Values();
  for (int64_t step = 3; step < 6; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));

  PSFLOW_ASSERT_OK(f.chief->RestorePs(1));
  auto step = f.client->Pull(f.PullTargets());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 3);
  ExpectSameValues(f.Values(), at_checkpoint, "values after the restore");  // ps 0's halves too
  auto restored = f.client->PullState();
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->variables.size(), saved->variables.size());
  for (size_t v = 0; v < saved->variables.size(); ++v) {
    EXPECT_EQ(restored->variables[v].updates, saved->variables[v].updates) << saved->variables[v].name;
    ExpectSameValues(restored->variables[v].slots, saved->variables[v].slots, "slots of " + saved->variables[v].name);
  }
  EXPECT_NE(f.log.back().find("restoring every ps task at global step 3"), std::string::npos) << f.log.back();
  // Training goes on from there.
  ASSERT_NO_FATAL_FAILURE(f.Step(3));
}

// A chief restarted while the ps tasks kept the job: it takes the job up without initializing it
// again, and learns the job's optimizer from the ps tasks, so its checkpoints hold Adam's slots
// as the first chief's did (a restarted chief once pulled them as SGD's none, and every
// checkpoint it tried failed).
TEST(ChiefRestartTest, ARestartedChiefTakesUpTheJobAndCheckpointsItsOptimizerState) {
  ChiefFixture f;
  ASSERT_NO_FATAL_FAILURE(f.Start(FreshDir("chief_restart_ckpt")));
  for (int64_t step = 0; step < 3; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  auto before = f.client->PullState();
  ASSERT_TRUE(before.ok()) << before.status();

  auto client = f.cluster->Client(f.plan, 0, {}, f.sink);
  PSFLOW_ASSERT_OK(client->Connect());
  Chief::InitialValues initial;
  for (const Var& p : f.model->parameters()) initial.at_start.push_back(&p->value);
  Chief restarted(f.options, f.options.model, *client, VariableSpecsOf(f.model->parameters()), std::move(initial),
                  f.config, *f.optimizer, f.sink);
  PSFLOW_ASSERT_OK(restarted.InitializeCluster());
  EXPECT_NE(f.log.back().find("already initialized"), std::string::npos) << f.log.back();
  PSFLOW_ASSERT_OK(restarted.SaveCheckpoint());
  auto after = client->PullState();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->global_step, 3);
  ASSERT_NO_FATAL_FAILURE(ps::testing::ExpectSameSnapshot(*after, *before, 2));  // Adam's m and v
}

TEST(ChiefRestoreTest, ARestoreWaitsForAnotherPsTaskThatIsDownUntilItIsBack) {
  ChiefFixture f;
  f.options.ps_timeout_secs = 30;
  ASSERT_NO_FATAL_FAILURE(f.Start(FreshDir("chief_restore_down")));
  ASSERT_NO_FATAL_FAILURE(f.Step(0));
  PSFLOW_ASSERT_OK(f.chief->SaveCheckpoint());
  const std::vector<Tensor> at_checkpoint = f.Values();
  ASSERT_NO_FATAL_FAILURE(f.Step(1));
  // ps 0 restarted (the restore's cause) while ps 1 is down; ps 1 comes back 1.5 s later.
  const std::string address = f.cluster->cluster.ps()[1];
  f.cluster->servers[1]->Stop();
  f.cluster->servers[1].reset();
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ps::PsServer::Options o;
    o.listen_address = address;
    o.task_index = 1;
    o.log = [](const std::string&) {};
    auto server = ps::PsServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) f.cluster->servers[1] = *std::move(server);
  });
  const absl::Status restored = f.chief->RestorePs(0);
  restart.join();
  PSFLOW_ASSERT_OK(restored);
  bool retried = false;
  // The ps client retries a silent task itself (naming it) before the chief's own retry would.
  for (const std::string& line : f.log) {
    retried |= line.find("; retrying") != std::string::npos || line.find("waiting for ps task 1") != std::string::npos;
  }
  EXPECT_TRUE(retried) << "the restore never found ps 1 down";
  auto step = f.client->Pull(f.PullTargets());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  ExpectSameValues(f.Values(), at_checkpoint, "values after a restore that waited for ps 1");
}

TEST(ChiefRestoreTest, BeforeTheFirstCheckpointTheJobStartsOverFromTheInitializers) {
  ChiefFixture f;
  ASSERT_NO_FATAL_FAILURE(f.Start(FreshDir("chief_restore_nockpt")));
  const std::vector<Tensor> initial = f.Values();
  for (int64_t step = 0; step < 4; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  // The chief's own parameters now hold what it pulled, not the initial values.
  ASSERT_NE(f.Values()[0][0], initial[0][0]);

  PSFLOW_ASSERT_OK(f.chief->RestorePs(0));
  auto step = f.client->Pull(f.PullTargets());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  ExpectSameValues(f.Values(), initial, "values after a restore with no checkpoint yet");
  EXPECT_NE(f.log.back().find("from the initial values (no checkpoint saved yet"), std::string::npos) << f.log.back();
}

TEST(ChiefRestoreTest, ACallersOwnInitializationIsWhatTheJobStartsAndStartsOverFrom) {
  ChiefFixture f;
  f.own_initialization = true;
  ASSERT_NO_FATAL_FAILURE(f.Start(FreshDir("chief_restore_own_init")));
  const std::vector<Tensor> initial = f.Values();
  auto pulled = f.client->Pull(f.PullTargets());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ExpectSameValues(f.Values(), initial, "values the chief initialized the ps tasks with");
  for (int64_t step = 0; step < 4; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  ASSERT_NE(f.Values()[0][0], initial[0][0]);

  PSFLOW_ASSERT_OK(f.chief->RestorePs(1));
  auto step = f.client->Pull(f.PullTargets());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  ExpectSameValues(f.Values(), initial, "values after a restore with no checkpoint yet");
}

TEST(ChiefRestoreTest, WithoutACheckpointDirOnlyTheRestartedTaskStartsOver) {
  ChiefFixture f;
  ASSERT_NO_FATAL_FAILURE(f.Start(""));
  const std::vector<Tensor> initial = f.Values();
  for (int64_t step = 0; step < 4; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  const std::vector<Tensor> trained = f.Values();

  PSFLOW_ASSERT_OK(f.chief->RestorePs(1));
  ASSERT_TRUE(f.client->Pull(f.PullTargets()).ok());
  for (const dist::ShardSpec* shard : f.plan.ShardsOn(1)) {
    // ps 1's shards are back at their initial values; every other element kept its training.
    size_t v = 0;
    while (f.model->parameters()[v]->name != shard->variable) ++v;
    const Tensor& now = f.model->parameters()[v]->value;
    const int64_t row = now.size() / now.shape()[0];
    for (int64_t i = shard->offset * row; i < (shard->offset + shard->shape[0]) * row; ++i) {
      ASSERT_EQ(now[i], initial[v][i]) << shard->name << " element " << i;
    }
  }
  size_t kept = 0;
  for (const dist::ShardSpec* shard : f.plan.ShardsOn(0)) {
    size_t v = 0;
    while (f.model->parameters()[v]->name != shard->variable) ++v;
    const int64_t row = trained[v].size() / trained[v].shape()[0];
    for (int64_t i = shard->offset * row; i < (shard->offset + shard->shape[0]) * row; ++i) {
      ASSERT_EQ(f.model->parameters()[v]->value[i], trained[v][i]) << shard->name << " element " << i;
      ++kept;
    }
  }
  EXPECT_GT(kept, 0u);
}

TEST(ChiefRestoreTest, ASyncPushHeldDuringTheRestoreIsToldToWaitForTheChief) {
  ChiefFixture f;
  ASSERT_NO_FATAL_FAILURE(f.Start(FreshDir("chief_restore_sync"), /*sync=*/true));
  auto worker = f.cluster->Client(f.plan, 1);
  ASSERT_NE(worker, nullptr);
  PSFLOW_ASSERT_OK(worker->Connect());
  PSFLOW_ASSERT_OK(worker->WaitForInitialization(10));
  std::vector<Tensor> grads;
  std::vector<ps::Gradient> pushed;
  for (const Var& p : f.model->parameters()) grads.emplace_back(p->value.shape());
  for (size_t i = 0; i < grads.size(); ++i) pushed.push_back({f.model->parameters()[i]->name, &grads[i], nullptr});
  // Worker 1's push waits for the chief's (R = 2); the chief restores instead.
  absl::StatusOr<ps::PushResult> held;
  std::thread pusher([&] { held = worker->Push(pushed, 0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PSFLOW_ASSERT_OK(f.chief->RestorePs(0));
  pusher.join();
  ASSERT_FALSE(held.ok());
  EXPECT_TRUE(ps::IsPsRestarted(held.status())) << held.status();
  // What the worker then does: wait for the chief, pull, and push again.
  PSFLOW_ASSERT_OK(worker->WaitForInitialization(10));
}

// Memory (docs/memory.md): a fresh job's chief sends the initial values only, no optimizer slots
// (each ps makes them itself: Adam's m and v start at zero), so neither the chief nor a ps holds
// a second copy of the optimizer state at start-up. The values are the model's initializers.
TEST(ChiefInitTest, AFreshJobSendsTheValuesAloneAndThePsTasksMakeTheSlots) {
  ChiefFixture f;
  ASSERT_NO_FATAL_FAILURE(f.Start(""));
  int64_t param_bytes = 0;
  for (const Var& p : f.model->parameters()) param_bytes += 4 * p->value.size();
  auto stats = f.client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t bytes_in = 0;
  for (const ps::PsTaskStats& s : *stats) bytes_in += s.bytes_in;
  EXPECT_GE(bytes_in, param_bytes);
  // Values and Adam's two slots would be 3x; headers and the small calls are far below 1x.
  EXPECT_LT(bytes_in, 2 * param_bytes) << "the chief sent more than the values";
  auto state = f.client->PullState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->global_step, 0);
  auto fresh = nn::BuildModel({f.options.model, f.options.hidden_units, f.options.seed});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_EQ(state->variables.size(), (*fresh)->parameters().size());
  for (const ps::VariableSnapshot& v : state->variables) {
    EXPECT_EQ(v.updates, 0) << v.name;
    ASSERT_EQ(v.slots.size(), 2u) << v.name;
    for (const Tensor& slot : v.slots) {
      for (int64_t i = 0; i < slot.size(); ++i) ASSERT_EQ(slot[i], 0.0f) << v.name << " slot element " << i;
    }
    const Var* initial = nullptr;
    for (const Var& p : (*fresh)->parameters()) {
      if (p->name == v.name) initial = &p;
    }
    ASSERT_NE(initial, nullptr) << v.name;
    ExpectSameValues({v.value}, {(*initial)->value}, "initial value of " + v.name);
  }
}

// The POSIX Env, except that creating a checkpoint file waits until the test opens the gate: a save
// that lasts exactly as long as the test wants, without timing.
class GatedEnv final : public io::Env {
 public:
  absl::StatusOr<std::unique_ptr<io::WritableFile>> NewWritableFile(const std::string& path, CreateMode mode) override {
    if (path.find("model.ckpt-") != std::string::npos) {
      absl::MutexLock lock(&mu_);
      ++entered_;
      mu_.Await(absl::Condition(&open_));
    }
    return base_->NewWritableFile(path, mode);
  }
  absl::StatusOr<std::unique_ptr<io::SequentialFile>> NewSequentialFile(const std::string& path) override {
    return base_->NewSequentialFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return base_->RenameFile(from, to);
  }
  absl::Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  absl::Status CreateDir(const std::string& dir) override { return base_->CreateDir(dir); }
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return base_->GetChildren(dir);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  absl::Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }

  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Waits until `n` checkpoint files have been asked for.
  void WaitForEntered(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  int entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }

 private:
  io::Env* base_ = io::Env::Default();
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

bool Logged(const std::vector<std::string>& log, const std::string& part) {
  for (const std::string& line : log) {
    if (line.find(part) != std::string::npos) return true;
  }
  return false;
}

// Issue 26.4: a save held up the chief's own training (129 of 400 steps). Now the save of step 10
// is held inside its file write while the chief steps five more times; the file holds step 10's
// state, not a later one; the next save is the next one due, and the final save waits for a save in
// flight and does not write the same step twice.
TEST(ChiefSaveTest, TheChiefStepsOnWhileItsSaveWrites) {
  ChiefFixture f;
  GatedEnv gate;
  f.options.env = &gate;
  f.options.save_checkpoint_steps = 10;
  const std::string dir = FreshDir("chief_save_beside");
  ASSERT_NO_FATAL_FAILURE(f.Start(dir));
  for (int64_t step = 0; step < 10; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  auto at_save = f.client->PullState();
  ASSERT_TRUE(at_save.ok()) << at_save.status();
  ASSERT_EQ(at_save->global_step, 10);

  gate.Close();
  PSFLOW_ASSERT_OK(f.chief->MaybeCheckpoint(10));  // returns with the save started
  gate.WaitForEntered(1);                          // the save pulled step 10 and holds its file
  int64_t steps_during_save = 0;
  for (int64_t step = 10; step < 15; ++step) {
    ASSERT_NO_FATAL_FAILURE(f.Step(step));
    ++steps_during_save;
    PSFLOW_ASSERT_OK(f.chief->MaybeCheckpoint(step + 1));  // none due before step 20
  }
  EXPECT_EQ(steps_during_save, 5);
  EXPECT_EQ(gate.entered(), 1) << "a second save started while the first was in flight";
  EXPECT_FALSE(Logged(f.log, "saved checkpoint"));
  gate.Open();
  f.chief->WaitForSave();
  EXPECT_TRUE(Logged(f.log, "model.ckpt-10.safetensors")) << "the save did not end with step 10's file";

  auto loaded =
      LoadTrainingState(dir, f.options.model, VariableSpecsOf(f.model->parameters()), *f.optimizer, f.sink, &gate);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->global_step, 10);
  for (const ps::VariableSnapshot& v : at_save->variables) {
    const VariableState& in_file = (*loaded)->variables.at(v.name);
    ExpectSameValues({in_file.value}, {v.value}, "saved value of " + v.name);
    ExpectSameValues(in_file.slots, v.slots, "saved slots of " + v.name);
  }

  for (int64_t step = 15; step < 20; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  PSFLOW_ASSERT_OK(f.chief->MaybeCheckpoint(20));
  PSFLOW_ASSERT_OK(f.chief->SaveFinalCheckpoint(20));
  EXPECT_EQ(gate.entered(), 2);
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-20.safetensors"));
}

// A save that fails on the save thread (a full disk) is logged, and the next interval's save is tried.
TEST(ChiefSaveTest, AFailedSaveIsLoggedAndTheNextOneTried) {
  ChiefFixture f;
  io::FaultInjectionEnv disk;
  f.options.env = &disk;
  f.options.save_checkpoint_steps = 2;
  const std::string dir = FreshDir("chief_save_failed");
  ASSERT_NO_FATAL_FAILURE(f.Start(dir));
  disk.Inject({.op = io::FileOp::kAppend, .nth = 1, .error = ENOSPC, .path_part = "model.ckpt-"});
  for (int64_t step = 0; step < 2; ++step) ASSERT_NO_FATAL_FAILURE(f.Step(step));
  PSFLOW_ASSERT_OK(f.chief->MaybeCheckpoint(2));
  f.chief->WaitForSave();
  EXPECT_TRUE(Logged(f.log, "checkpoint failed: ")) << "the failed save was not logged";
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.ckpt-2.safetensors"));
  ASSERT_NO_FATAL_FAILURE(f.Step(2));
  PSFLOW_ASSERT_OK(f.chief->MaybeCheckpoint(3));  // not due again before the next interval
  f.chief->WaitForSave();
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.ckpt-3.safetensors"));
  ASSERT_NO_FATAL_FAILURE(f.Step(3));
  PSFLOW_ASSERT_OK(f.chief->MaybeCheckpoint(4));
  f.chief->WaitForSave();
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-4.safetensors"));
}

}  // namespace
}  // namespace psflow::train
