// The retry policy's blocking front and its silence log (ps/common/retry.h).
#include "ps/common/retry.h"

#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace psflow::ps {

void SilenceLog::Log(const std::string& line) const {
  if (log_) {
    log_(line);
  } else {
    std::cerr << line << std::endl;
  }
}

void SilenceLog::NoteSilent(const std::string& peer, const std::string& what, const std::string& why,
                            double elapsed_secs, double budget_secs, const std::string& flag) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto [it, first] = silent_.try_emplace(peer, Silence{now - absl::Seconds(elapsed_secs), now});
    if (!first) {
      if (now - it->second.last_log < absl::Seconds(kSilenceLogEverySecs)) return;
      it->second.last_log = now;
    }
  }
  Log(absl::StrCat("waiting for ", peer, ", silent for ", static_cast<int>(elapsed_secs), " s: ", why, "; retrying ",
                   what, " for up to ", absl::SixDigits(budget_secs), " s in all (", flag, ")"));
}

void SilenceLog::NoteReached(const std::string& peer) {
  absl::Time since;
  {
    absl::MutexLock lock(&mu_);
    auto it = silent_.find(peer);
    if (it == silent_.end()) return;
    since = it->second.since;
    silent_.erase(it);
  }
  Log(absl::StrCat(peer, " answered again after ", absl::SixDigits(absl::ToDoubleSeconds(absl::Now() - since)),
                   " s of silence"));
}

absl::Status RetryBlocking(const RetryOptions& options, const std::function<absl::Status(double)>& attempt) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  Backoff backoff;
  absl::Status last;
  for (;;) {
    last = attempt(std::max(0.05, options.budget_secs - elapsed()));
    if (options.retryable ? !options.retryable(last) : !IsRetryable(last)) {
      if (options.log != nullptr) options.log->NoteReached(options.peer);
      return last;
    }
    std::string why(last.message());
    if (absl::StartsWith(why, options.peer + ": ")) why = why.substr(options.peer.size() + 2);
    const double left = options.budget_secs - elapsed();
    if (left <= 0.05) {
      if (options.give_up) return options.give_up(why, last);
      const bool hinted = absl::StrContains(why, "is the task running") || absl::StrContains(why, "--tls_");
      return absl::DeadlineExceededError(absl::StrCat(
          "gave up on ", options.peer, " after ", absl::SixDigits(options.budget_secs), " s: ", options.what, ": ", why,
          absl::IsUnavailable(last) && !hinted ? " (is it running, and is the address right?)" : "", "; raise ",
          options.budget_flag, " to wait longer"));
    }
    if (options.log != nullptr && elapsed() >= options.quiet_secs) {
      options.log->NoteSilent(options.peer, options.what, why, elapsed(), options.budget_secs, options.budget_flag);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(backoff.Next(), left - 0.05)));
  }
}

}  // namespace psflow::ps
