// Calls fanned out to several ps tasks, with deadlines sized to their bytes and retries of silent
// tasks (ps/fan_out.h, ps/call_deadline.h).
#include "ps/fan_out.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ps/call_deadline.h"
#include "ps/wire_config.h"
#include "psflow/ps/ps_client.h"

namespace psflow::ps {
namespace {

constexpr char kRestartedPayload[] = "type.psflow/ps_restarted";
constexpr char kRestartedText[] = " is not initialized (restarted?)";

// The state of one CallAll, shared by its calls' completions (and their retries' timers).
struct FanOut {
  std::vector<absl::Status> statuses;
  std::atomic<int> remaining{0};
  std::function<absl::Status(int k, const rpc::IncomingMessage& response)> on_response;
  std::function<void(std::vector<absl::Status>&)> on_all;
  rpc::Method method;
  rpc::CallOptions options;
  std::vector<rpc::ClientChannel*> channels;
  std::vector<rpc::OutgoingMessage> requests;  // kept for retries (only with a retrier)
  Retrier* retrier = nullptr;
  std::vector<double> attempt_secs;  // each call's full attempt deadline
  std::vector<double> budget_secs;   // how long each call keeps trying (0 without a retrier)
  std::vector<absl::Time> first_start;
  std::vector<double> backoff_secs;
  std::vector<int> attempts;
};

// A ps task answering that it holds no variables (it restarted): the status IsPsRestarted knows.
absl::Status RestartedError(const rpc::ClientChannel* channel, int task) {
  absl::Status s = absl::FailedPreconditionError(absl::StrCat(
      channel->peer_name(), kRestartedText, ": it lost its variables, or the chief is restoring it; the chief restores "
      "the job from the last checkpoint"));
  s.SetPayload(kRestartedPayload, absl::Cord(absl::StrCat(task)));
  return s;
}

std::string WithoutPeer(const rpc::ClientChannel* channel, const absl::Status& s) {
  std::string why(s.message());
  if (absl::StartsWith(why, channel->peer_name() + ": ")) why = why.substr(channel->peer_name().size() + 2);
  return why;
}

// The error of a call that stayed silent for its whole budget.
absl::Status GaveUp(const FanOut& fan, size_t k, const absl::Status& last, double elapsed_secs) {
  const rpc::ClientChannel* channel = fan.channels[k];
  const std::string why = WithoutPeer(channel, last);
  const bool hinted = absl::StrContains(why, "is the task running");
  const std::string text = absl::StrCat(
      "gave up on ", channel->peer_name(), " after ",
      // The bound, or the first attempt's longer deadline.
      absl::SixDigits(elapsed_secs < fan.budget_secs[k] + 1 ? fan.budget_secs[k] : std::round(elapsed_secs)),
      " s without an answer to ", rpc::MethodName(fan.method), " (", fan.attempts[k], " attempt(s); last: ", why, ")",
      absl::IsUnavailable(last) && !hinted ? "; is the ps task running, and is its address right?" : "",
      "; a task silent this long is taken for lost: raise --ps_timeout_secs (now ",
      absl::SixDigits(fan.retrier->give_up_secs()), " s) to wait longer, or --rpc_timeout_secs (each attempt: ",
      absl::SixDigits(fan.options.timeout_secs), " s + 1 s per MiB moved) on a slow link");
  return absl::Status(last.code(), text);
}

void StartCall(const std::shared_ptr<FanOut>& fan, size_t k) {
  const absl::Time now = absl::Now();
  if (fan->first_start[k] == absl::InfinitePast()) fan->first_start[k] = now;
  ++fan->attempts[k];
  rpc::CallOptions options = fan->options;
  options.timeout_secs = fan->attempt_secs[k];
  if (fan->retrier != nullptr && fan->attempts[k] > 1) {
    // The first attempt gets its whole deadline, however long; a retry ends with the budget.
    const double left = fan->budget_secs[k] - absl::ToDoubleSeconds(now - fan->first_start[k]);
    options.timeout_secs = std::max(0.05, std::min(options.timeout_secs, left));
  }
  rpc::OutgoingMessage request = fan->retrier ? fan->requests[k] : std::move(fan->requests[k]);
  fan->channels[k]->Call(fan->method, std::move(request), options,
                         [fan, k](absl::StatusOr<rpc::IncomingMessage> response) {
    absl::Status s = response.status();
    const rpc::ClientChannel* channel = fan->channels[k];
    if (Retrier* retrier = fan->retrier; retrier != nullptr) {
      if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
        const double elapsed = absl::ToDoubleSeconds(absl::Now() - fan->first_start[k]);
        const double left = fan->budget_secs[k] - elapsed;
        if (left > 0.05) {
          retrier->NoteSilent(channel, fan->method, s, elapsed, fan->budget_secs[k]);
          const double delay = std::min(fan->backoff_secs[k], left - 0.05);
          fan->backoff_secs[k] = std::min(fan->backoff_secs[k] * 2, 2.0);
          retrier->RunAfter(delay, [fan, k] { StartCall(fan, k); });
          return;
        }
        s = GaveUp(*fan, k, s, elapsed);
      } else {
        retrier->NoteReached(channel);
      }
      if (absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), kNotInitializedMessage)) {
        s = RestartedError(channel, retrier->TaskOf(channel));
      }
    }
    if (s.ok() && fan->on_response) s = fan->on_response(static_cast<int>(k), *response);
    fan->statuses[k] = std::move(s);
    if (fan->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) fan->on_all(fan->statuses);
  });
}

}  // namespace

int64_t MessageBytes(const rpc::OutgoingMessage& message) {
  int64_t bytes = static_cast<int64_t>(message.header.size());
  for (const rpc::OutgoingTensor& t : message.tensors) bytes += t.num_floats * static_cast<int64_t>(sizeof(float));
  return bytes;
}

void CallAll(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
             std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
             std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
             std::function<void(std::vector<absl::Status>&)> on_all, Retrier* retrier,
             std::vector<int64_t> answer_bytes, double budget_secs) {
  auto fan = std::make_shared<FanOut>();
  const size_t n = channels.size();
  fan->statuses.resize(n);
  fan->remaining = static_cast<int>(n);
  fan->on_response = std::move(on_response);
  fan->on_all = std::move(on_all);
  fan->method = method;
  fan->options = options;
  fan->channels = channels;
  fan->retrier = retrier;
  if (retrier != nullptr && budget_secs < 0) budget_secs = retrier->give_up_secs();
  for (size_t k = 0; k < n; ++k) {
    const int64_t bytes = MessageBytes(requests[k]) + (k < answer_bytes.size() ? answer_bytes[k] : 0);
    fan->attempt_secs.push_back(AttemptDeadlineSecs(options.timeout_secs, bytes));
    fan->budget_secs.push_back(retrier != nullptr ? budget_secs : 0);
  }
  fan->requests = std::move(requests);
  fan->first_start.assign(n, absl::InfinitePast());
  fan->backoff_secs.assign(n, 0.05);
  fan->attempts.assign(n, 0);
  if (channels.empty()) {
    fan->on_all(fan->statuses);
    return;
  }
  for (size_t k = 0; k < n; ++k) StartCall(fan, k);
}

// The first error, preferring OutOfRange (training finished) so callers recognize the end.
absl::Status Combine(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (absl::IsOutOfRange(s)) return s;
  }
  for (const absl::Status& s : statuses) {
    if (IsPsRestarted(s)) return s;  // the chief acts on it (InitializePs)
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}


bool IsPsRestarted(const absl::Status& status) { return RestartedPsTask(status) >= 0; }

int RestartedPsTask(const absl::Status& status) {
  if (!absl::IsFailedPrecondition(status)) return -1;
  auto task = status.GetPayload(kRestartedPayload);
  int k = -1;
  if (task.has_value() && absl::SimpleAtoi(std::string(*task), &k)) return k;
  // The payload is lost when the status was rebuilt: read "ps task N (...) is not initialized".
  const absl::string_view m = status.message();
  const size_t at = m.find("ps task ");
  if (m.find(kRestartedText) == absl::string_view::npos || at == absl::string_view::npos) return -1;
  const absl::string_view rest = m.substr(at + 8);
  return absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &k) ? k : -1;
}

void Retrier::Log(const std::string& line) const {
  if (log_) {
    log_(line);
  } else {
    std::cerr << line << std::endl;
  }
}

void Retrier::NoteSilent(const rpc::ClientChannel* channel, rpc::Method method, const absl::Status& status,
                         double elapsed_secs, double budget_secs) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto [it, first] = silent_.try_emplace(channel, Silence{now - absl::Seconds(elapsed_secs), now});
    if (!first) {
      if (now - it->second.last_log < absl::Seconds(10)) return;
      it->second.last_log = now;
    }
  }
  Log(absl::StrCat("waiting for ", channel->peer_name(), ", silent for ", static_cast<int>(elapsed_secs), " s: ",
                   WithoutPeer(channel, status), "; retrying ", rpc::MethodName(method), " for up to ",
                   absl::SixDigits(budget_secs), " s in all (--ps_timeout_secs)"));
}

void Retrier::NoteReached(const rpc::ClientChannel* channel) {
  absl::Time since;
  {
    absl::MutexLock lock(&mu_);
    auto it = silent_.find(channel);
    if (it == silent_.end()) return;
    since = it->second.since;
    silent_.erase(it);
  }
  Log(absl::StrCat(channel->peer_name(), " answered again after ",
                   absl::SixDigits(absl::ToDoubleSeconds(absl::Now() - since)), " s of silence"));
}

}  // namespace psflow::ps
