// The pieces of a worker session's report that are plain data work: an evaluation's scalars checked
// and written as text, the final evaluation's figures put into the RunSummary, and the ps tasks'
// traffic and tables added to it. WorkerSession (train/session.cc) owns the session and calls these
// at its evaluations and at Close; they hold no state.
#ifndef PSFLOW_TRAIN_SESSION_SUMMARY_H_
#define PSFLOW_TRAIN_SESSION_SUMMARY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "psflow/ps/ps_client.h"
#include "psflow/train/session.h"
#include "psflow/train/summary.h"

namespace psflow::train {

// "name=value name=value" of an evaluation's scalars.
std::string ScalarsText(const std::vector<std::pair<std::string, double>>& scalars);

// An evaluation's scalars: each name must be a valid metric name (they become TensorBoard tags and
// summary fields as they are).
absl::Status CheckEval(const SessionEval& eval);

// The final evaluation into `summary`: the four validation/test figures by name (NaN: not measured,
// absent), every other scalar as the caller named it, and the ctr block.
void AddEvalToSummary(const SessionEval& eval, RunSummary* summary);

// The ps tasks' figures into `summary`: each task's traffic and tables, a ctr job's table rows, and
// the stale pushes and staleness counted once, by the task holding the global step.
void AddPsStatsToSummary(const std::vector<ps::PsTaskStats>& stats, int global_step_ps, RunSummary* summary);

// The workers that took part, into summary->workers: those that pushed (a worker that never came is
// not counted); logs the ones that never pushed.
void CountWorkersThatPushed(const std::vector<ps::PsTaskStats>& stats, int num_workers,
                            const std::function<void(const std::string&)>& log, RunSummary* summary);

// The summary's line logged, and written as JSON to `metrics_json` when it is not empty.
absl::Status ReportSummary(const RunSummary& summary, const std::string& metrics_json,
                           const std::function<void(const std::string&)>& log);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SESSION_SUMMARY_H_
