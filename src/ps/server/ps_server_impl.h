// ps/server/ps_server_impl.h — the parameter server's state and RPC handlers (behind PsServer).
//
// Locks, never nested except where noted: mu_ guards the lifecycle (initialization, connected
// workers, shutdown) and the held WaitInitialized calls; the sync step's quorum, drops, timeout
// and held pushes are ps/server/sync_accumulator.h's (its own mutex, which may take a shard's mutex
// while applying a step); each Shard has its own mutex for its values. The model (shards,
// optimizer, config) is an immutable snapshot swapped atomically by Initialize, so the push and
// pull paths take no global lock in async mode.
#ifndef PSFLOW_PS_SERVER_PS_SERVER_IMPL_H_
#define PSFLOW_PS_SERVER_PS_SERVER_IMPL_H_

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/psflow.pb.h"
#include "ps/server/ps_tables.h"
#include "ps/server/push_dedup.h"
#include "ps/server/shard.h"
#include "ps/server/sync_accumulator.h"
#include "ps/server/table/disk_store.h"
#include "ps/server/work_queue.h"
#include "psflow/ps/ps_server.h"
#include "rpc/transport.h"

namespace psflow::ps {

class PsServer::Impl final : public rpc::Handler {
 public:
  explicit Impl(Options options);
  ~Impl() override;

  absl::Status Start();
  absl::Status Wait();
  void Stop();
  SyncAccumulator::Timing sync_timing() const { return sync_.timing(); }
  PsTaskStats Stats() const;
  std::optional<PsTaskStats> ReportedStats() const {
    absl::MutexLock lock(&mu_);
    return reported_;
  }
  int port() const { return server_ ? server_->port() : 0; }

  void Handle(rpc::Method method, rpc::IncomingMessage request, rpc::Responder responder) override;

 private:
  // What Initialize installs; immutable afterwards (shards mutate under their own locks).
  struct Model {
    TrainingConfig config;
    wire::TrainingConfig config_wire;
    std::unique_ptr<optim::Optimizer> optimizer;
    // Parameter groups (optim::ParameterGroup): one rule per group, and the rule of each shard of
    // a grouped variable; other shards use `optimizer`.
    std::vector<std::unique_ptr<optim::Optimizer>> group_rules;
    absl::flat_hash_map<std::string, const optim::Optimizer*> rule_by_variable;
    absl::flat_hash_map<const Shard*, const optim::Optimizer*> rule_by_shard;
    std::vector<std::shared_ptr<Shard>> shards;
    absl::flat_hash_map<std::string, std::shared_ptr<Shard>> by_name;
    std::vector<wire::ShardInfo> shard_infos;
    std::string signature;
    uint64_t fingerprint = 0;
    bool holds_global_step = false;
    rpc::WireDtype wire_dtype = rpc::WireDtype::kFloat32;  // config.wire_dtype (each shard has it too)
    int64_t num_params = 0;
    uint64_t sync_epoch = 0;  // sync mode: the accumulator's epoch of this model (its Push)
    // Names this model to the clients (random, never 0; PushRequest.model_id): a push computed
    // from another model's values (before a restore) is refused as "not initialized".
    uint64_t id = 0;
    std::unique_ptr<PsTables> tables;  // the embedding tables' shards on this task (ps_tables.h)

    // The rule that updates `shard` (its config gives the learning rate: optim::LearningRateAt).
    const optim::Optimizer& RuleFor(const Shard* shard) const {
      auto it = rule_by_shard.find(shard);
      return it == rule_by_shard.end() ? *optimizer : *it->second;
    }
  };

  // A model bigger than the chief's part size, staged part by part (ps_initialize.cc).
  struct StagedModel {
    uint64_t client_id = 0, first_seq = 0;  // the Initialize it belongs to
    bool with_slots = false;
    std::shared_ptr<Model> model;  // config and optimizer; shards added at the last part
    struct Buffers {
      wire::ShardInfo info;
      FloatBuffer values;
      optim::SlotState state;
      std::vector<int64_t> filled;  // elements received so far: values, then each slot (restores)
    };
    std::vector<Buffers> shards;
    absl::flat_hash_map<std::string, size_t> index;  // shard name -> shards[i]
  };

  // Initialize (ps_initialize.cc): the model of a header; a shard added to it; a part of an
  // Initialize in parts; installing a complete model (not again for a retry of the one installed
  // last).
  absl::StatusOr<std::shared_ptr<Model>> NewModel(const wire::InitializeRequest& init);
  static void AddShard(Model& model, const wire::ShardInfo& info, FloatBuffer values, optim::SlotState state);
  absl::Status InitializePart(const rpc::IncomingMessage& request, const wire::InitializeRequest& init)
      ABSL_LOCKS_EXCLUDED(init_mu_, mu_);
  absl::Status Install(std::shared_ptr<Model> model, uint64_t client_id, uint64_t seq, uint64_t first_seq)
      ABSL_LOCKS_EXCLUDED(mu_);
  void HandleInitialize(const rpc::IncomingMessage& request, rpc::Responder responder);

  // Control RPCs (ps_server.cc).
  void HandleHello(const rpc::IncomingMessage& request, rpc::Responder responder);
  void HandleMarkInitialized(rpc::Responder responder);
  void HandleWaitInitialized(rpc::Responder responder);
  void HandlePull(const rpc::IncomingMessage& request, rpc::Responder responder);
  // A pull in parts (PullRequest.slices): copies of the runs asked for.
  void HandlePullSlices(const Model& m, const wire::PullRequest& pull, rpc::Responder responder);
  void HandleGoodbye(const rpc::IncomingMessage& request, rpc::Responder responder);
  void HandleShutdown(const rpc::IncomingMessage& request, rpc::Responder responder);
  void HandleStats(rpc::Responder responder);
  wire::WaitInitializedResponse InitializedResponse(const Model& model) const;

  // Table checkpoint RPCs (ps_table_calls.cc): a checkpoint's rows stored (the chief restoring,
  // before MarkInitialized), and one part of a table shard's scan.
  void HandleLoadTable(const rpc::IncomingMessage& request, rpc::Responder responder);
  void HandleScanTable(const rpc::IncomingMessage& request, rpc::Responder responder);
  // The job's work queue of training-file slices, on ps task 0 (ps_work_queue.cc).
  void HandleWorkQueue(const rpc::IncomingMessage& request, rpc::Responder responder);

  // Data RPCs (ps_push.cc). HandlePush is the push path's entry: it parses and validates, then
  // hands the push to one of the two modes (not to be confused with PsClient::PushAsync, a
  // non-blocking *call*): async mode applies it at once, sync mode gives it to sync_.
  void HandlePush(const rpc::IncomingMessage& request, rpc::Responder responder);
  // A push's table blocks: gradient rows, and the prefetch (rows its answer carries).
  struct TablePush {
    std::vector<TableBlock> rows, prefetch;
    // Hybrid sync: the prefetch's rows gathered on arrival (right after the push's own rows were
    // applied), answered with the step; or why they could not be.
    std::vector<rpc::OutgoingTensor> gathered;
    absl::Status gathered_status;
  };
  // A push checked against the model and copied off the wire: what the modes apply and answer.
  struct ValidPush {
    std::vector<ShardGradient> gradients;
    std::vector<std::shared_ptr<Shard>> pulls;
    std::shared_ptr<TablePush> tables;
  };
  // HandlePush's steps. AdmitPush: the push's responder, or nullopt for a retry of a push already
  // applied (answered with its first answer, push_dedup.h). ValidatePush: everything checked and
  // copied before anything is applied (a refused push changes nothing) — the table blocks
  // (DecodeTableBlocks), the dense gradients (DecodeGradients), the shards it pulls; the error
  // names what is wrong.
  std::optional<rpc::Responder> AdmitPush(const std::shared_ptr<const Model>& model, const wire::PushRequest& header,
                                          rpc::Responder responder);
  static absl::Status ValidatePush(const Model& model, const rpc::IncomingMessage& request,
                                   const wire::PushRequest& header, ValidPush* push);
  static absl::Status DecodeTableBlocks(const Model& model, const rpc::IncomingMessage& request,
                                        const wire::PushRequest& header, int num_dense, TablePush* tables);
  static absl::Status DecodeGradients(const Model& model, const rpc::IncomingMessage& request,
                                      const wire::PushRequest& header, int num_dense,
                                      std::vector<ShardGradient>* gradients);
  void PushInAsyncMode(const Model& model, std::vector<ShardGradient>& gradients, const wire::PushRequest& header,
                       std::vector<std::shared_ptr<Shard>> pulls, std::shared_ptr<TablePush> tables,
                       rpc::Responder responder);
  void PushInSyncMode(const Model& model, const std::vector<ShardGradient>& gradients, const wire::PushRequest& header,
                      std::vector<std::shared_ptr<Shard>> pulls, std::shared_ptr<TablePush> tables,
                      rpc::Responder responder);
  // The answer to a push: its step, the values of the shards it asked to pull, then the rows of
  // its prefetch blocks (gathered now: after the push's step). A disk table's failure to gather
  // (the task is ending: TableState::on_failure) instead of the answer.
  static absl::StatusOr<rpc::OutgoingMessage> PushAnswer(const std::vector<std::shared_ptr<Shard>>& pulls, int64_t step,
                                                         bool stale, uint64_t model_id,
                                                         const std::vector<TableBlock>* prefetch = nullptr);
  // The sync accumulator's configuration for `model` (ps_push.cc).
  SyncAccumulator::Config SyncConfig(std::shared_ptr<const Model> model) const;

  std::shared_ptr<const Model> model() const { return model_.load(std::memory_order_acquire); }
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  // True once pushes must be refused: after the chief's Shutdown, or when this task's step counter
  // is the global step (or sync mode) and reached train_steps.
  bool Finished(const Model& model) const;
  absl::Status FinishedError() const;
  std::vector<int> ExpectedWorkers(const Model& model) const;
  void Log(const std::string& message) const;

  // Why Wait() should give up now (a bound passed), or OK.
  absl::Status GiveUpReason() const ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the table scans left unread past options_.table_scan_timeout_secs (logged).
  void DropIdleScans() ABSL_LOCKS_EXCLUDED(mu_);

  // After the shutdown: every connected worker said Goodbye, and every worker of the cluster said
  // Hello at least once (a worker that starts after a short job ended learns it is over from
  // this task's answer, instead of retrying a closed port until --ps_timeout_secs).
  bool DoneWaiting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || (connected_.empty() && static_cast<int>(greeted_.size()) >= options_.cluster.num_workers());
  }
  bool ShutdownOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || shutdown_; }

  const Options options_;
  std::unique_ptr<rpc::Server> server_;
  // Disk tables' directory and cache (options_.table_storage == "disk"), opened by Start.
  std::shared_ptr<ps::table::DiskTier> disk_;
  // A failure that ends the task (a disk table's): Wait() returns it.
  void FailTask(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status task_failure_ ABSL_GUARDED_BY(mu_);

  std::atomic<std::shared_ptr<const Model>> model_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> shutdown_flag_{false};
  std::atomic<int64_t> step_{0};  // async: the global step (on its ps); sync: this task's step
  std::atomic<int64_t> pushes_refused_{0};
  // Async: whole pushes applied by staleness τ (global steps between the pull their gradient was
  // computed from, the push's step tag, and their apply): buckets τ = 0 .. kStalenessBuckets - 2,
  // the last one counting the rest (PsTaskStats::staleness_counts). A ps without the global step
  // measures τ against the newest step tag it has seen (the global step as the workers last saw it).
  static constexpr int kStalenessBuckets = 65;
  std::array<std::atomic<int64_t>, kStalenessBuckets> staleness_{};
  std::atomic<int64_t> newest_tag_{0};
  // pushed_[i]: worker i had a push accepted (Stats' pushed_worker_indices); one flag per worker
  // of the cluster, set once, read by Stats.
  std::unique_ptr<std::atomic<bool>[]> pushed_;
  int num_pushed_flags_ = 0;

  mutable absl::Mutex mu_;
  std::vector<rpc::Responder> init_waiters_ ABSL_GUARDED_BY(mu_);
  // Client id -> worker index of the clients that said Hello and not yet Goodbye.
  absl::flat_hash_map<uint64_t, int> connected_ ABSL_GUARDED_BY(mu_);
  // Worker indices that ever said Hello (of the cluster's: others are not counted).
  absl::flat_hash_set<int> greeted_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time shutdown_time_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> finished_step_{0};
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);             // set by a Shutdown that aborts the job
  std::optional<PsTaskStats> reported_ ABSL_GUARDED_BY(mu_);  // the latest Stats answer
  std::atomic<bool> aborted_{false};
  // absl::GetCurrentTimeNanos() of the start or latest re-initialization, and of the latest call.
  std::atomic<int64_t> uninitialized_since_nanos_{absl::GetCurrentTimeNanos()};
  std::atomic<int64_t> last_call_nanos_{absl::GetCurrentTimeNanos()};
  // Retried pushes are applied once (ps/server/push_dedup.h); so are retried Initializes (the last one
  // applied, by client id and number).
  PushDedup dedup_;
  WorkQueue work_queue_;  // ps task 0's (ps/server/work_queue.h); thread-safe itself
  uint64_t last_init_client_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_init_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_init_first_seq_ ABSL_GUARDED_BY(mu_) = 0;  // of the last Initialize in parts
  // The Initialize in parts under way (lock order: init_mu_, then mu_).
  absl::Mutex init_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<StagedModel> staged_ ABSL_GUARDED_BY(init_mu_);
  // The last worker that gave up on the job (Goodbye with a failure), and why.
  std::string worker_failure_ ABSL_GUARDED_BY(mu_);

  // Sync mode: the current step's quorum, drops, timeout and held pushes. Advances step_.
  SyncAccumulator sync_{&step_, [this](const std::string& line) { Log(line); }, std::make_unique<SystemClock>()};
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_SERVER_PS_SERVER_IMPL_H_
