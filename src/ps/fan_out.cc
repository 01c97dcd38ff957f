// Calls fanned out to several ps tasks, with retries of unreachable ones (ps/fan_out.h).
#include "ps/fan_out.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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
  std::vector<absl::Time> first_failure;
  std::vector<double> backoff_secs;
};

// A ps task answering that it holds no variables (it restarted): the status IsPsRestarted knows.
absl::Status RestartedError(const rpc::ClientChannel* channel, int task) {
  absl::Status s = absl::FailedPreconditionError(absl::StrCat(
      channel->peer_name(), kRestartedText, ": it lost its variables, or the chief is restoring it; the chief restores "
      "the job from the last checkpoint"));
  s.SetPayload(kRestartedPayload, absl::Cord(absl::StrCat(task)));
  return s;
}

void StartCall(const std::shared_ptr<FanOut>& fan, size_t k) {
  rpc::OutgoingMessage request = fan->retrier ? fan->requests[k] : std::move(fan->requests[k]);
  fan->channels[k]->Call(fan->method, std::move(request), fan->options,
                         [fan, k](absl::StatusOr<rpc::IncomingMessage> response) {
    absl::Status s = response.status();
    const rpc::ClientChannel* channel = fan->channels[k];
    if (Retrier* retrier = fan->retrier; retrier != nullptr) {
      if (absl::IsUnavailable(s)) {
        const absl::Time now = absl::Now();
        if (fan->first_failure[k] == absl::InfinitePast()) fan->first_failure[k] = now;
        const double left = retrier->give_up_secs() - absl::ToDoubleSeconds(now - fan->first_failure[k]);
        if (left > 0) {
          retrier->NoteUnreachable(channel, s);
          const double delay = std::min(fan->backoff_secs[k], left);
          fan->backoff_secs[k] = std::min(fan->backoff_secs[k] * 2, 2.0);
          retrier->RunAfter(delay, [fan, k] { StartCall(fan, k); });
          return;
        }
        std::string why(s.message());
        if (absl::StartsWith(why, channel->peer_name() + ": ")) why = why.substr(channel->peer_name().size() + 2);
        const bool hinted = absl::StrContains(why, "is the task running");
        s = absl::UnavailableError(absl::StrCat("gave up on ", channel->peer_name(), " after ",
                                                retrier->give_up_secs(), " s unreachable",
                                                hinted ? "" : " (is the ps task running, and is its address right?)",
                                                ": ", why));
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

void CallAll(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
             std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
             std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
             std::function<void(std::vector<absl::Status>&)> on_all, Retrier* retrier) {
  auto fan = std::make_shared<FanOut>();
  fan->statuses.resize(channels.size());
  fan->remaining = static_cast<int>(channels.size());
  fan->on_response = std::move(on_response);
  fan->on_all = std::move(on_all);
  fan->method = method;
  fan->options = options;
  fan->channels = channels;
  fan->requests = std::move(requests);
  fan->retrier = retrier;
  fan->first_failure.assign(channels.size(), absl::InfinitePast());
  fan->backoff_secs.assign(channels.size(), 0.05);
  if (channels.empty()) {
    fan->on_all(fan->statuses);
    return;
  }
  for (size_t k = 0; k < channels.size(); ++k) StartCall(fan, k);
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

void Retrier::NoteUnreachable(const rpc::ClientChannel* channel, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!waiting_.insert(channel).second) return;
  }
  std::string why(status.message());
  if (absl::StartsWith(why, channel->peer_name() + ": ")) why = why.substr(channel->peer_name().size() + 2);
  const std::string line = absl::StrCat("waiting for ", channel->peer_name(), ": ", why, "; retrying for up to ",
                                        give_up_secs_, " s");
  if (log_) {
    log_(line);
  } else {
    std::cerr << line << std::endl;
  }
}

}  // namespace psflow::ps
