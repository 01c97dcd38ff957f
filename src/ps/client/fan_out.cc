// Calls fanned out to several ps tasks, with deadlines sized to their bytes and retries of silent
// tasks (ps/client/fan_out.h, ps/client/call_deadline.h).
#include "ps/client/fan_out.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ps/client/call_deadline.h"
#include "ps/common/wire_config.h"
#include "psflow/ps/ps_client.h"

namespace psflow::ps {
namespace {

constexpr char kRestartedPayload[] = "type.psflow/ps_restarted";
constexpr char kRestartedText[] = " is not initialized (restarted?)";

// One call of a CallAll and its attempts.
struct FannedCall {
  rpc::ClientChannel* channel = nullptr;
  rpc::OutgoingMessage request;  // kept for retries (only with a retrier)
  double attempt_secs = 0;       // the full deadline of an attempt
  double budget_secs = 0;        // how long the call keeps trying (0 without a retrier)
  absl::Time first_start = absl::InfinitePast();
  Backoff backoff;
  int attempts = 0;
  absl::Status status;
};

// The state of one CallAll, shared by its calls' completions (and their retries' timers).
struct FanOut {
  std::vector<FannedCall> calls;
  std::atomic<int> remaining{0};
  std::function<absl::Status(int k, const rpc::IncomingMessage& response)> on_response;
  std::function<void(std::vector<absl::Status>&)> on_all;
  rpc::Method method;
  rpc::CallOptions options;
  Retrier* retrier = nullptr;
};

// A ps task answering that it holds no variables (it restarted): the status IsPsRestarted knows.
absl::Status RestartedError(const rpc::ClientChannel* channel, int task) {
  absl::Status s = absl::FailedPreconditionError(
      absl::StrCat(channel->peer_name(), kRestartedText,
                   ": it lost its variables, or the chief is restoring it; the chief restores "
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
absl::Status GaveUp(const FanOut& fan, const FannedCall& call, const absl::Status& last, double elapsed_secs) {
  const rpc::ClientChannel* channel = call.channel;
  const std::string why = WithoutPeer(channel, last);
  const bool hinted = absl::StrContains(why, "is the task running");
  const std::string text = absl::StrCat(
      "gave up on ", channel->peer_name(), " after ",
      // The bound, or the first attempt's longer deadline.
      absl::SixDigits(elapsed_secs < call.budget_secs + 1 ? call.budget_secs : std::round(elapsed_secs)),
      " s without an answer to ", rpc::MethodName(fan.method), " (", call.attempts, " attempt(s); last: ", why, ")",
      absl::IsUnavailable(last) && !hinted ? "; is the ps task running, and is its address right?" : "",
      "; a task silent this long is taken for lost: raise --ps_timeout_secs (now ",
      absl::SixDigits(fan.retrier->give_up_secs()),
      " s) to wait longer, or --rpc_timeout_secs (each attempt: ", absl::SixDigits(fan.options.timeout_secs),
      " s + 1 s per MiB moved) on a slow link");
  return absl::Status(last.code(), text);
}

void StartCall(const std::shared_ptr<FanOut>& fan, size_t k) {
  FannedCall& call = fan->calls[k];
  const absl::Time now = absl::Now();
  if (call.first_start == absl::InfinitePast()) call.first_start = now;
  ++call.attempts;
  rpc::CallOptions options = fan->options;
  options.timeout_secs = call.attempt_secs;
  if (fan->retrier != nullptr && call.attempts > 1) {
    // The first attempt gets its whole deadline, however long; a retry ends with the budget.
    const double left = call.budget_secs - absl::ToDoubleSeconds(now - call.first_start);
    options.timeout_secs = std::max(0.05, std::min(options.timeout_secs, left));
  }
  rpc::OutgoingMessage request = fan->retrier ? call.request : std::move(call.request);
  call.channel->Call(fan->method, std::move(request), options, [fan, k](absl::StatusOr<rpc::IncomingMessage> response) {
    FannedCall& call = fan->calls[k];
    absl::Status s = response.status();
    if (Retrier* retrier = fan->retrier; retrier != nullptr) {
      if (IsRetryable(s)) {
        const double elapsed = absl::ToDoubleSeconds(absl::Now() - call.first_start);
        const double left = call.budget_secs - elapsed;
        if (left > 0.05) {
          retrier->NoteSilent(call.channel, fan->method, s, elapsed, call.budget_secs);
          retrier->RunAfter(std::min(call.backoff.Next(), left - 0.05), [fan, k] { StartCall(fan, k); });
          return;
        }
        s = GaveUp(*fan, call, s, elapsed);
      } else {
        retrier->NoteReached(call.channel);
      }
      if (absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), kNotInitializedMessage)) {
        s = RestartedError(call.channel, retrier->TaskOf(call.channel));
      }
    }
    if (s.ok() && fan->on_response) s = fan->on_response(static_cast<int>(k), *response);
    call.status = std::move(s);
    if (fan->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::vector<absl::Status> statuses;
      for (FannedCall& c : fan->calls) statuses.push_back(std::move(c.status));
      fan->on_all(statuses);
    }
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
  fan->remaining = static_cast<int>(n);
  fan->on_response = std::move(on_response);
  fan->on_all = std::move(on_all);
  fan->method = method;
  fan->options = options;
  fan->retrier = retrier;
  if (retrier != nullptr && budget_secs < 0) budget_secs = retrier->give_up_secs();
  fan->calls.resize(n);
  for (size_t k = 0; k < n; ++k) {
    FannedCall& call = fan->calls[k];
    const int64_t bytes = MessageBytes(requests[k]) + (k < answer_bytes.size() ? answer_bytes[k] : 0);
    call.channel = channels[k];
    call.request = std::move(requests[k]);
    call.attempt_secs = AttemptDeadlineSecs(options.timeout_secs, bytes);
    call.budget_secs = retrier != nullptr ? budget_secs : 0;
  }
  if (channels.empty()) {
    std::vector<absl::Status> none;
    fan->on_all(none);
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

void Retrier::NoteSilent(const rpc::ClientChannel* channel, rpc::Method method, const absl::Status& status,
                         double elapsed_secs, double budget_secs) {
  silences_.NoteSilent(channel->peer_name(), rpc::MethodName(method), WithoutPeer(channel, status), elapsed_secs,
                       budget_secs, "--ps_timeout_secs");
}

}  // namespace psflow::ps
