// train/session_tables.h — a worker session's embedding tables on this worker (psflow/train/session.h,
// docs/tables.md): each declared table's current batch (its unique ids, each example's position
// among them, the rows looked up, the gradients the caller wrote) and the next batch's prefetched
// rows. It decides what rides on the session's calls — which rows a Lookup still has to pull, which
// gradients and prefetches a Step carries — and calls a ps itself for one thing only: the async
// pull ahead of a prefetch (StartAhead), on the session's client; everything else the session
// sends. Owns its buffers (the TableBatch the caller reads and writes between Lookup and Step); the
// session's one thread uses it (the pull ahead's answer arrives on a transport thread).
#ifndef PSFLOW_TRAIN_SESSION_TABLES_H_
#define PSFLOW_TRAIN_SESSION_TABLES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "psflow/core/tensor.h"
#include "psflow/core/unique_ids.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_client.h"
#include "psflow/train/session.h"

namespace psflow::train {

// What a push that outlives its step keeps of the tables (StepCall's `kept`): the pushed tables'
// ids and gradients, where the call points, and the owners of gradients the caller lent
// (TableBatch::grads_owner), let go of by Release once the push no longer reads them.
struct KeptTables {
  std::vector<std::vector<int64_t>> ids;
  std::vector<Tensor> grads;
  std::vector<std::shared_ptr<const void>> owners;
  void Release() { owners.clear(); }
};

class SessionTables {
 public:
  explicit SessionTables(std::vector<dist::TableSpec> tables);

  int size() const { return static_cast<int>(tables_.size()); }
  const std::vector<dist::TableSpec>& specs() const { return tables_; }
  // InvalidArgument unless `given` spans were passed for the declared tables (`call` names the call).
  absl::Status CheckCount(const char* call, size_t given) const;

  // Lookup: each table's ids deduplicated into its batch (gradients cleared); the rows the last
  // step prefetched for exactly these ids are taken, the others' pulls are added to `step` (their
  // destination the batch's rows). Any prefetch is used up. A table given the very ids its
  // prefetch was given (element for element) takes the prefetch's deduplication instead of
  // deduplicating them again.
  void StartLookup(const std::vector<absl::Span<const int64_t>>& ids, ps::TableStep* step);
  // Prefetch: the next batch's unique ids, to ride on the next step's call.
  void Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids);
  // The same with each table's deduplication done by the caller (unique[t] = DedupIds of
  // next_ids[t], e.g. on a thread of its own while the last step waited): taken over (swapped out
  // of `unique`). InvalidArgument naming the table, and nothing changed, when a table's unique
  // ids and index do not give back its ids in order of first appearance.
  absl::Status Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids, std::vector<UniqueIds>* unique);
  // Step: the tables' part of the step's call — each table's gradients (when the caller wrote
  // some) and the prefetch asked for (unless it is pulled ahead).
  ps::TableStep StepCall();
  // The same for a push that outlives the step (a deferred Step: the next Lookup reuses the
  // batch's buffers): the pushed tables' ids, gradients and lent gradients' owners are moved into
  // `kept`, where the call points.
  ps::TableStep StepCall(KeptTables* kept);
  // The ids each table's last Prefetch was given, as given (its copy of them; empty for a table
  // never asked): what LookupPrefetched looks up. Valid until the next Prefetch.
  std::vector<absl::Span<const int64_t>> PrefetchedIds() const;
  // Whether a prefetch rides on the next Step's push (asked, not pulled ahead, some ids).
  bool RidesOnPush() const;
  // Whether Lookup(ids) needs no call: every table's ids are the ones its valid prefetch was
  // given (or none).
  bool ServedByPrefetch(const std::vector<absl::Span<const int64_t>>& ids) const;
  // The prefetched rows not taken yet are dropped (read before a push that failed).
  void DropPrefetched();
  // After the step's call: the gradients (and lent ones' owners) are consumed whatever the outcome; the prefetched rows
  // (not pulled ahead) are valid only when the call succeeded.
  void EndStep(bool call_ok);
  // Async pull ahead (docs/sync-async.md#overlap): the prefetch asked for, as a call of its own
  // sent now instead of riding on the next Step (the tables in it are marked pulled ahead; an
  // empty call when nothing was asked or every asked table has no ids). Until EndAhead the caller
  // must not touch the tables (the answer writes their prefetched rows).
  ps::TableStep AheadCall();
  // The pull ahead answered: its rows are valid when `ok`.
  void EndAhead(bool ok);
  // AheadCall sent on `client` (borrowed: it must outlive the call; SettleAhead before it goes),
  // its answer writing the prefetched rows on a transport thread. Nothing to pull: ended at once.
  void StartAhead(ps::PsClient& client);
  // Waits for the pull StartAhead sent (at once when none runs), then EndAhead(ok && it succeeded).
  void SettleAhead(bool ok);
  // Waits for that pull's answer only (the tables stay marked pulled ahead until SettleAhead).
  void WaitAhead();

  // Table `t` (declaration order) of the current batch; CHECKs t.
  TableBatch& batch(int t);

  // Keeps the rows of tables [first, first + count) in one buffer (WorkerSession::GroupTables): the
  // group's index, or InvalidArgument (not consecutive declared tables of one dim, or a table in
  // another group) / FailedPrecondition (after the first Lookup or Prefetch), naming what is wrong.
  absl::StatusOr<int> Group(int first, int count);
  int num_groups() const { return static_cast<int>(groups_.size()); }
  // Group `g` of the current batch; CHECKs g.
  TableGroupBatch& group(int g);

 private:
  // A table's next batch: the ids given to Prefetch (`raw`, as given; `ids` and `index`, their
  // deduplication; `asked`: ride on the next Step, or `ahead`: pulled in a call of its own), and
  // the rows that came back with its answer (`valid`).
  struct Prefetched {
    std::vector<int64_t> raw, ids, index;
    Tensor rows;
    bool asked = false, ahead = false, valid = false;
  };

  // Whether `ids` are the ids a prefetch was given (`raw`): its own copy (LookupPrefetched) at once,
  // else element for element.
  static bool SameIds(absl::Span<const int64_t> raw, absl::Span<const int64_t> ids);
  // A batch's gradients, written or lent (the owner let go of), dropped.
  static void DropGrads(TableBatch* b);
  // OK when `unique` is `raw` deduplicated (DedupIds' order of first appearance), else why not.
  static absl::Status CheckUnique(absl::Span<const int64_t> raw, const UniqueIds& unique);
  // Table t's prefetch asks for `raw`, deduplicated into `unique` (taken over).
  void Ask(size_t t, absl::Span<const int64_t> raw, UniqueIds* unique);
  // After the Asks of a Prefetch: each group's next buffer sized for its tables' unique ids.
  void SizeGroupsNext();
  // Group g's rows for the batch StartLookup deduplicated: the prefetched buffer itself when every
  // table's rows came with it (`taken`, per table), else a new buffer, prefetched rows copied in and
  // the others' pulls added to `step`.
  void FillGroup(size_t g, const std::vector<char>& taken, ps::TableStep* step);
  // `out` = [n, tables]: example i's row of each table (index[k][i] + offsets[k]), when every table
  // has n examples (true); else false.
  static bool GroupIndex(const std::vector<const std::vector<int64_t>*>& index, const std::vector<int64_t>& offsets,
                         std::vector<int64_t>* out);
  // The pull of table t's prefetch (into its Prefetched rows, or its place in its group's next buffer).
  ps::TableRowsRef PrefetchPull(size_t t);

  std::vector<dist::TableSpec> tables_;
  std::vector<TableBatch> batches_;
  std::vector<Prefetched> prefetched_;
  // Tables whose rows share one buffer: the current batch's (`batch`) and the prefetch's (`next`,
  // table first + k's rows from row next_offsets[k]; a grouped table's Prefetched::rows stay empty).
  struct TableGroup {
    TableGroupBatch batch;
    Tensor next;
    std::vector<int64_t> next_offsets;
    std::vector<int64_t> next_index;  // the prefetch's TableGroupBatch::index, made where it deduplicates
    bool next_has_index = false;
  };
  std::vector<TableGroup> groups_;
  std::vector<int> group_of_;  // per table: its group, or -1
  // StartLookup's, per table: 2 its deduplication and rows came with the prefetch, 1 its rows only, 0 neither
  std::vector<char> taken_;
  bool started_ = false;  // a Lookup or Prefetch ran (no Group after it)
  // The pull ahead in flight (StartAhead), or null; its call's routing is made at the send.
  struct Ahead {
    absl::Notification done;
    absl::Status status;  // written before done
  };
  std::shared_ptr<Ahead> ahead_;
  UniqueIds dedup_;  // reused per call
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SESSION_TABLES_H_
