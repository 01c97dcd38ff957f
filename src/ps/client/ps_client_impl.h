// ps/client/ps_client_impl.h — PsClient::Impl, what stands behind psflow/ps/ps_client.h: one channel per
// ps task, each variable's route (its shards and the ps tasks holding them), the Retrier every call
// shares, and the training configuration learned from the chief. PsClient forwards to it.
//
// Its methods live in two files: ps_client_control.cc has connecting and the control calls (Init,
// Connect, the chief's Initialize and restores, PullState, WaitForInitialization, IsInitialized,
// Goodbye, Shutdown, Abort, Stats); ps_client.cc has the data path (Pull, Push,
// PushAndPull, and the fan-out helpers they share) and PsClient's forwarding functions.
//
// Thread-safe. options_, client_id_, channels_, retrier_ and routes_ are set by Init(), before the
// PsClient exists, and only read afterwards; mu_ guards config_ (set by Initialize and
// WaitForInitialization, read by every push); next_seq_ and last_global_step_ are atomics. The
// fan-out's callbacks run on transport threads, concurrently for different ps tasks: they read the
// members Init() set, note the global step and fill their own call's results; a blocking call from
// one of them is CHECKed (it would deadlock).
#ifndef PSFLOW_PS_CLIENT_PS_CLIENT_IMPL_H_
#define PSFLOW_PS_CLIENT_PS_CLIENT_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "proto/psflow.pb.h"
#include "ps/client/call_parts.h"
#include "ps/client/fan_out.h"
#include "ps/client/slice_pipe.h"
#include "ps/client/table_calls.h"
#include "ps/client/wait_heartbeat.h"
#include "psflow/ps/ps_client.h"
#include "rpc/transport.h"

namespace psflow::ps {

struct SlicedPush;  // one push in slices (slice_pipe.cc)

struct VariableRoute {
  dist::VariableSpec spec;
  std::vector<dist::ShardSpec> shards;  // in shard order
};

// Parses an answer's header; DataLoss naming `peer` when it is malformed.
absl::Status Parse(const rpc::IncomingMessage& response, google::protobuf::MessageLite* header,
                   const std::string& peer);

class PsClient::Impl {
 public:
  explicit Impl(Options options);

  absl::Status Init();
  void Log(const std::string& line) const;

  int num_ps() const { return static_cast<int>(channels_.size()); }
  int gs_ps() const { return options_.plan.global_step_ps; }
  rpc::ClientChannel* channel(int k) const { return channels_[k].get(); }
  std::vector<rpc::ClientChannel*> AllChannels() const {
    std::vector<rpc::ClientChannel*> all;
    for (const auto& c : channels_) all.push_back(c.get());
    return all;
  }
  rpc::CallOptions Control(double timeout) const {
    rpc::CallOptions o;
    o.timeout_secs = timeout;
    return o;
  }

  // Runs the same request on every ps and waits; with `retry`, retrying silent tasks for up to
  // `budget_secs` (negative: --ps_timeout_secs).
  absl::Status CallEveryPs(rpc::Method method, const google::protobuf::MessageLite& header, double timeout,
                           std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response = nullptr,
                           bool retry = true, double budget_secs = -1);

  static absl::Status CallAndWait(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
                                  std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
                                  std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
                                  Retrier* retrier = nullptr, std::vector<int64_t> answer_bytes = {},
                                  double budget_secs = -1);

  absl::Status ConnectOne(int k);
  absl::Status Connect();

  absl::Status Initialize(const std::vector<std::pair<std::string, const Tensor*>>& variables,
                          const TrainingConfig& config);
  absl::Status Initialize(const ModelSnapshot& state, TrainingConfig config, const std::vector<int>& tasks);

  std::vector<int> AllTasks() const {
    std::vector<int> tasks(channels_.size());
    for (int k = 0; k < num_ps(); ++k) tasks[k] = k;
    return tasks;
  }

  // A variable's initial state: its value, and (restores) its slots and update count.
  struct InitSource {
    const Tensor* value = nullptr;
    const std::vector<Tensor>* slots = nullptr;
    int64_t updates = 0;
  };

  // Initializes the given ps tasks (validated sources for every variable), then marks them initialized.
  // `tables` (or null): the tables' rows loaded after the Initialize calls, before marking.
  absl::Status InitializeTasks(const std::vector<int>& tasks, const absl::flat_hash_map<std::string, InitSource>& given,
                               bool with_slots, const TrainingConfig& config,
                               const std::vector<std::pair<std::string, TablePartSource>>* tables = nullptr);
  absl::Status Initialize(const ModelSnapshot& state, TrainingConfig config, const std::vector<int>& tasks,
                          const std::vector<std::pair<std::string, TablePartSource>>* tables);

  // Tables in checkpoints (table_checkpoint.cc).
  absl::Status ScanTable(const std::string& table, int64_t max_rows, const TableScanOptions& options,
                         const std::function<absl::Status(TableRowsPart part)>& sink);
  absl::Status OpenTableScans(const std::vector<std::string>& tables, const TableScanOptions& options)
      ABSL_LOCKS_EXCLUDED(scans_mu_);
  absl::Status CloseTableScans() ABSL_LOCKS_EXCLUDED(scans_mu_);
  absl::Status LoadTable(const std::string& table, const TablePartSource& source);

  absl::StatusOr<ModelSnapshot> PullState();
  absl::Status WaitForInitialization(double timeout_secs);
  absl::StatusOr<bool> IsInitialized();

  // Where each pulled shard goes, per ps task: the whole shard, as a run [0, its size).
  using Targets = std::vector<std::vector<SliceTarget>>;

  absl::StatusOr<std::shared_ptr<Targets>> PullTargets(const char* what,
                                                       const std::vector<std::pair<std::string, Tensor*>>& out) const;

  // Copies the whole shards or runs (a pull in parts, ps/client/call_parts.h) of a Pull (or
  // push-and-pull) answer from ps task k into their targets; with `with_slots` (the answer's
  // header, a checkpoint's pull) also their slots and update counts.
  // `table_tensors`: table rows after the shards (ignored here, ScatterTableRows reads them).
  absl::Status AssembleAnswer(int k, const rpc::IncomingMessage& r, const std::vector<SliceTarget>& runs,
                              const wire::PullResponse* with_slots, int table_tensors = 0) const;
  // Whether a pull of `targets` from one ps task goes in parts (it is bigger than a part);
  // `floats_per_element`: 1 + the optimizer's slots for a checkpoint's pull.
  bool PullInParts(const std::vector<SliceTarget>& targets, int64_t floats_per_element = 1) const {
    return options_.max_part_bytes > 0 && TargetBytes(targets) * floats_per_element > options_.max_part_bytes;
  }
  // Adds a Pull of whole shards from ps task k to round `r` of `rounds`.
  // With `tables`, the table blocks ride on it (their rows end its answer).
  void AddWholePull(const std::vector<SliceTarget>& targets, int k, bool with_slots, int64_t floats_per_element,
                    size_t r, std::vector<CallRound>* rounds,
                    const std::vector<TableBlockCall>* tables = nullptr) const;
  // Adds the parts of the pulls from `tasks` to `rounds`, the first in round `first_round`.
  void AddPullRounds(const Targets& targets, const std::vector<int>& tasks, size_t first_round, bool with_slots,
                     int64_t floats_per_element, std::vector<CallRound>* rounds) const;

  void PullAsync(const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep* tables,
                 std::function<void(absl::StatusOr<int64_t>)> done);
  // A Pull (or a checkpoint's, `with_slots`) of `targets`, whole or in parts, and of the tables'
  // rows of `tables` (or null); `done` gets the global step its ps answered.
  void SendPull(std::shared_ptr<Targets> targets, bool with_slots, int64_t floats_per_element,
                std::function<void(absl::StatusOr<PushResult>)> done, std::shared_ptr<TableWork> tables = nullptr);

  absl::StatusOr<Tensor> PullRows(const std::string& variable, const std::vector<int64_t>& rows);

  // Push, or push-and-pull when `out` is given. `early_part`: a part of a push sent as backward
  // goes (PushStream): to the ps tasks holding these gradients only, every call with more parts
  // to come, nothing read from the answers (`out` and `tables` must be null).
  void PushAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                 const std::vector<std::pair<std::string, Tensor*>>* out, const TableStep* tables,
                 std::function<void(absl::StatusOr<PushResult>)> done, bool early_part = false);
  // Sync: while a push's last part waits for its earlier parts (one of them held by a stalled ps
  // task), every ps task hears that this worker is alive (ps/client/wait_heartbeat.h), so that the
  // others keep it in their quorum. Null in async mode. Stop() it when the wait ends.
  std::shared_ptr<WaitHeartbeat> StartPartsHeartbeat();
  // Sends round r of a push or pull (a call to each ps task with a part left; ps/client/call_parts.h)
  // and, once all answered, the next round; `done` gets the outcome after the last round or the
  // first failed one.
  // A push's gradients cut into each ps task's tensors, validated (a push spanning several ps
  // tasks is refused as a whole, before any applies its part).
  using PerPs = std::vector<std::vector<rpc::OutgoingTensor>>;
  absl::StatusOr<PerPs> RouteGradients(const std::vector<Gradient>& grads) const;
  // With a 16-bit --wire_dtype: replaces each dense gradient of `per_ps` by its rounding to the
  // wire dtype with the shard's residual added (error feedback), named in that dtype.
  void RoundForWire(PerPs* per_ps);
  // The rounds of calls of a push (parts when async and big) and of the pull of `targets` (when
  // given) that rides on it or follows it in parts.
  // `tables` (or null): each task's table pushes and prefetch ride on its last part.
  std::vector<CallRound> PushRounds(PerPs per_ps, int64_t step_tag, const Targets* targets,
                                    const TrainingConfig& config, const TableWork* tables, bool early_part = false);
  // `tables` keeps the table blocks the calls' answers are scattered by alive until the last round.
  void SendRound(std::shared_ptr<std::vector<CallRound>> rounds, size_t r, std::shared_ptr<Targets> targets,
                 std::shared_ptr<WaitHeartbeat> heartbeat, std::shared_ptr<PushResult> result,
                 std::function<void(absl::StatusOr<PushResult>)> done, std::shared_ptr<TableWork> tables = nullptr);

  // Push and pull pipelined in slices (ps/client/slice_pipe.h, slice_pipe.cc). SlicesFor: whether
  // a PushStream::Send of `grads` goes that way (slices on, a pull-back registered, async, and a
  // dense gradient of a pulled-back variable with a share on some ps task bigger than a slice).
  bool SlicesFor(const std::vector<Gradient>& grads) const ABSL_LOCKS_EXCLUDED(pull_back_mu_);
  // The early part `grads` of a push as backward goes, in slices with their values pulled back;
  // `done` once every slice's push was answered (or the first failed).
  void PushSlicesAsync(const std::vector<Gradient>& grads, int64_t step_tag,
                       std::function<void(absl::StatusOr<PushResult>)> done) ABSL_LOCKS_EXCLUDED(pull_back_mu_);
  // The registration of PsClient::PullBackSlices (replacing any), and its end.
  std::shared_ptr<SlicePulls::State> RegisterPullBack(std::vector<std::pair<std::string, Tensor*>> out)
      ABSL_LOCKS_EXCLUDED(pull_back_mu_);
  void UnregisterPullBack(const SlicePulls::State* state) ABSL_LOCKS_EXCLUDED(pull_back_mu_);
  int64_t transfer_slice_bytes() const { return options_.transfer_slice_bytes; }
  // PushSlicesAsync's steps: push task t's next parts (within the window), a part's push answered
  // (its pull sent, or its and the unsent parts' pulls ended by the failure), a part's pull.
  void SendSliceParts(const std::shared_ptr<SlicedPush>& push, size_t t);
  void SlicePushed(const std::shared_ptr<SlicedPush>& push, size_t t, size_t p, const absl::Status& s);
  void PullSlice(const std::shared_ptr<SlicedPush>& push, size_t t, size_t p);

  absl::Status Goodbye(const std::string& failure);
  absl::Status Shutdown();
  void Abort(const std::string& reason, double timeout_secs);
  absl::StatusOr<std::vector<PsTaskStats>> Stats();
  absl::StatusOr<WorkQueueAnswer> CallWorkQueue(const WorkQueueCall& call);

 private:
  // Bytes of the shards a pull (or push-and-pull) asks one ps task for.
  static int64_t TargetBytes(const std::vector<SliceTarget>& targets) {
    int64_t bytes = 0;
    for (const SliceTarget& t : targets) bytes += t.count * static_cast<int64_t>(sizeof(float));
    return bytes;
  }
  // Optimizer slots per variable (sizes a checkpoint's pull); 2 (Adam's) when not known yet.
  int64_t SlotCount() const;

  void SetConfig(const TrainingConfig& config) {
    absl::MutexLock lock(&mu_);
    config_ = config;
  }
  TrainingConfig GetConfig() const {
    absl::MutexLock lock(&mu_);
    return config_;
  }
  // Ps task `task`'s model as an answer from it named it (0, from a ps that names none: kept).
  void NoteModel(int task, uint64_t model_id) {
    if (model_id != 0) model_ids_[task].store(model_id, std::memory_order_relaxed);
  }
  uint64_t ModelOf(int task) const { return model_ids_[task].load(std::memory_order_relaxed); }
  // The newest global step a pull or push answer carried; Shutdown tells every ps task the final
  // one (a ps that does not hold the global step knows it from nowhere else).
  void NoteGlobalStep(int64_t step) {
    int64_t seen = last_global_step_.load();
    while (step > seen && !last_global_step_.compare_exchange_weak(seen, step)) {
    }
  }

  const Options options_;
  const uint64_t client_id_;
  std::atomic<uint64_t> next_seq_{1};  // pushes' and Initializes' ids, with client_id_
  std::vector<std::unique_ptr<rpc::ClientChannel>> channels_;
  std::unique_ptr<Retrier> retrier_;  // after channels_: destroyed first (its timers call them)
  // Which ps tasks this client ever reached (Connect): an abort is sent to these only, so a task
  // that never reached a ps does not wait out a second bound telling it the job is over.
  std::unique_ptr<std::atomic<bool>[]> reached_;
  // Each ps task's model as its last answer (a pull's, a push's) named it, or 0: what this client's
  // pushes carry (PushRequest.model_id), so a push computed before a restore is refused after it.
  std::unique_ptr<std::atomic<uint64_t>[]> model_ids_;
  absl::flat_hash_map<std::string, VariableRoute> routes_;
  mutable absl::Mutex mu_;
  TrainingConfig config_ ABSL_GUARDED_BY(mu_);  // learned from Initialize / WaitForInitialization
  std::atomic<int64_t> last_global_step_{0};    // see NoteGlobalStep
  // --wire_dtype (Options::wire_dtype) and, when 16-bit, each dense shard's rounding residual
  // (error feedback: added to its next gradient before rounding).
  rpc::WireDtype wire_dtype_ = rpc::WireDtype::kFloat32;  // set by Init
  // Scans opened by OpenTableScans and not read yet: per table, its shards' scan ids (plan order).
  absl::Mutex scans_mu_;
  absl::flat_hash_map<std::string, std::vector<uint64_t>> opened_scans_ ABSL_GUARDED_BY(scans_mu_);
  // PullBackSlices' registration (slice_pipe.cc), or null.
  mutable absl::Mutex pull_back_mu_;
  std::shared_ptr<SlicePulls::State> pull_back_ ABSL_GUARDED_BY(pull_back_mu_);
  absl::Mutex residual_mu_;
  absl::flat_hash_map<std::string, std::vector<float>> residuals_ ABSL_GUARDED_BY(residual_mu_);
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_PS_CLIENT_IMPL_H_
