// psflow/dist/slurm.cc — Slurm's hostlist and tasks-per-node syntaxes, --slurm_jobs, and the
// cluster of a job step (psflow/dist/slurm.h).
#include "psflow/dist/slurm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace psflow::dist {
namespace {

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Slurm refuses larger ranges too ("Too many hosts in range"); far beyond any real step.
constexpr size_t kMaxHosts = 65536;

absl::Status HostlistError(absl::string_view hostlist, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("\"", hostlist, "\" is not a Slurm hostlist: ", what));
}

// A bracket's content "01-03,7" to its numbers as text ("01", "02", "03", "7"), appended to *out.
absl::Status ExpandRanges(absl::string_view hostlist, absl::string_view ranges, std::vector<std::string>* out) {
  for (absl::string_view part : absl::StrSplit(ranges, ',')) {
    part = absl::StripAsciiWhitespace(part);
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    if (ends.size() == 1) ends.push_back(ends[0]);
    uint64_t lo = 0, hi = 0;
    const auto digits = [](absl::string_view s) {
      return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
    };
    if (ends.size() != 2 || !digits(ends[0]) || !digits(ends[1]) || !absl::SimpleAtoi(ends[0], &lo) ||
        !absl::SimpleAtoi(ends[1], &hi) || lo > hi) {
      return HostlistError(hostlist, absl::StrCat("range \"", part, "\" in [", ranges,
                                                  "] is not N or N-M with N <= M (e.g. n[01-03,7])"));
    }
    if (hi - lo >= kMaxHosts || out->size() + (hi - lo + 1) > kMaxHosts) {
      return HostlistError(hostlist, absl::StrCat("more than ", kMaxHosts, " hosts"));
    }
    const size_t width = ends[0].size();  // Slurm pads to the first number's width
    for (uint64_t i = lo; i <= hi; ++i) {
      std::string n = absl::StrCat(i);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out->push_back(std::move(n));
    }
  }
  return absl::OkStatus();
}

// One host expression without top-level commas: "n[01-03]", "rack[1-2]-n[1-2]", "m5".
absl::Status ExpandHost(absl::string_view hostlist, absl::string_view item, std::vector<std::string>* hosts) {
  // Texts and ranges alternate: text0 [r0] text1 [r1] ...; the name must end with a range or have none.
  std::vector<std::string> texts;
  std::vector<std::vector<std::string>> ranges;
  size_t at = 0;
  while (true) {
    const size_t open = item.find('[', at);
    const absl::string_view text =
        item.substr(at, open == absl::string_view::npos ? absl::string_view::npos : open - at);
    if (text.find(']') != absl::string_view::npos) {
      return HostlistError(hostlist, absl::StrCat("\"", item, "\" has a ']' without its '['"));
    }
    if (open == absl::string_view::npos) {
      if (!ranges.empty() && !text.empty()) {
        return HostlistError(hostlist,
                             absl::StrCat("\"", item, "\" has text after its last [range] (Slurm refuses it too)"));
      }
      texts.emplace_back(text);
      break;
    }
    texts.emplace_back(text);
    const size_t close = item.find(']', open);
    if (close == absl::string_view::npos) {
      return HostlistError(hostlist, absl::StrCat("\"", item, "\" has a '[' without its ']'"));
    }
    const absl::string_view inside = item.substr(open + 1, close - open - 1);
    if (inside.find('[') != absl::string_view::npos) {
      return HostlistError(hostlist, absl::StrCat("\"", item, "\" nests '[' inside [...]"));
    }
    ranges.emplace_back();
    if (absl::Status s = ExpandRanges(hostlist, inside, &ranges.back()); !s.ok()) return s;
    at = close + 1;
  }
  if (ranges.size() > 2) {
    // Slurm orders the hosts of three or more ranges by its own dimension rules.
    return HostlistError(hostlist, absl::StrCat("\"", item, "\" has more than two [ranges] in one name"));
  }
  // The cartesian product, the last range varying fastest (as scontrol prints "a[1-2]b[3-4]").
  std::vector<std::string> names = {texts[0]};
  for (size_t r = 0; r < ranges.size(); ++r) {
    std::vector<std::string> next;
    for (const std::string& prefix : names) {
      for (const std::string& n : ranges[r]) next.push_back(absl::StrCat(prefix, n, texts[r + 1]));
    }
    names = std::move(next);
    if (hosts->size() + names.size() > kMaxHosts)
      return HostlistError(hostlist, absl::StrCat("more than ", kMaxHosts, " hosts"));
  }
  hosts->insert(hosts->end(), names.begin(), names.end());
  return absl::OkStatus();
}

// A non-negative decimal that fits an int, or nullopt.
std::optional<int> ParseCount(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int v = 0;
  if (text.empty() || !std::all_of(text.begin(), text.end(), absl::ascii_isdigit) || !absl::SimpleAtoi(text, &v)) {
    return std::nullopt;
  }
  return v;
}

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist_in) {
  const absl::string_view hostlist = ToAbsl(hostlist_in);
  std::vector<std::string> hosts;
  // Split at the commas outside brackets; empty items are skipped, as Slurm does.
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    if (i < hostlist.size() && hostlist[i] == '[') ++depth;
    if (i < hostlist.size() && hostlist[i] == ']') depth = std::max(depth - 1, 0);
    if (i < hostlist.size() && (hostlist[i] != ',' || depth > 0)) continue;
    const absl::string_view item = absl::StripAsciiWhitespace(hostlist.substr(start, i - start));
    start = i + 1;
    if (item.empty()) continue;
    if (absl::Status s = ExpandHost(hostlist, item, &hosts); !s.ok()) return s;
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view text_in) {
  const absl::string_view text = ToAbsl(text_in);
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    absl::string_view count = part, repeat = "1";
    if (const size_t paren = part.find('('); paren != absl::string_view::npos) {
      count = part.substr(0, paren);
      repeat = part.substr(paren);
      if (!absl::ConsumePrefix(&repeat, "(x") || !absl::ConsumeSuffix(&repeat, ")")) repeat = "";
    }
    const std::optional<int> n = ParseCount(count), times = ParseCount(repeat);
    if (!n || !times || *n < 1 || *times < 1 || counts.size() + *times > kMaxHosts) {
      return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not Slurm's tasks per node: \"", part,
                                                     "\" is not N or N(xM) with N, M >= 1 (e.g. 2(x3),1)"));
    }
    counts.insert(counts.end(), *times, *n);
  }
  return counts;
}

absl::StatusOr<std::vector<SlurmJob>> ParseSlurmJobs(std::string_view text_in) {
  const absl::string_view text = absl::StripAsciiWhitespace(ToAbsl(text_in));
  std::vector<SlurmJob> jobs;
  const auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm_jobs=", text, ": ", what, " (e.g. --slurm_jobs=ps:1,worker:3)"));
  };
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    std::vector<absl::string_view> kv = absl::StrSplit(part, ':');
    const std::optional<int> n = kv.size() == 2 ? ParseCount(kv[1]) : std::nullopt;
    if (!n || *n < 1) return error(absl::StrCat("\"", part, "\" is not JOB:N with N >= 1"));
    const std::string name(absl::StripAsciiWhitespace(kv[0]));
    if (name != "ps" && name != "worker") {
      return error(absl::StrCat("unknown job \"", name, "\"; the jobs are ps and worker (worker 0 is the chief)"));
    }
    for (const SlurmJob& j : jobs) {
      if (j.name == name) return error(absl::StrCat("job ", name, " is listed twice"));
    }
    jobs.push_back({name, *n});
  }
  for (const char* needed : {"ps", "worker"}) {
    if (std::none_of(jobs.begin(), jobs.end(), [&](const SlurmJob& j) { return j.name == needed; })) {
      return error(absl::StrCat("no ", needed, " job; a cluster needs at least one ps and one worker"));
    }
  }
  return jobs;
}

std::optional<SlurmStep> SlurmStep::FromEnvironment() {
  SlurmStep step;
  step.nodelist = EnvOr("SLURM_STEP_NODELIST");
  step.procid = EnvOr("SLURM_PROCID");
  if (step.nodelist.empty() || step.procid.empty()) return std::nullopt;
  step.tasks_per_node = EnvOr("SLURM_STEP_TASKS_PER_NODE");
  step.num_tasks = EnvOr("SLURM_STEP_NUM_TASKS");
  step.localid = EnvOr("SLURM_LOCALID");
  step.nodename = EnvOr("SLURMD_NODENAME");
  return step;
}

std::optional<int> SlurmStep::TotalTasks() const {
  absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(tasks_per_node);
  if (!counts.ok()) return std::nullopt;
  int64_t total = 0;
  for (int c : *counts) total += c;
  if (total > static_cast<int64_t>(kMaxHosts) * 1024) return std::nullopt;
  return static_cast<int>(total);
}

absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ClusterFromSlurm(const SlurmStep& step, std::string_view jobs_text,
                                                                  int port_base) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(step.nodelist);
  if (!hosts.ok()) return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_NODELIST=", hosts.status().message()));
  if (step.tasks_per_node.empty()) {
    return absl::InvalidArgumentError(
        "SLURM_STEP_TASKS_PER_NODE is unset in this Slurm step: start the tasks with srun");
  }
  absl::StatusOr<std::vector<int>> per_node = ExpandTasksPerNode(step.tasks_per_node);
  if (!per_node.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_TASKS_PER_NODE=", per_node.status().message()));
  }
  if (hosts->size() != per_node->size()) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_NODELIST=", step.nodelist, " names ", hosts->size(),
                                                   " nodes but SLURM_STEP_TASKS_PER_NODE=", step.tasks_per_node,
                                                   " gives ", per_node->size(), ": the two must match"));
  }
  const std::optional<int> total_tasks = step.TotalTasks();
  if (!total_tasks) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_TASKS_PER_NODE=", step.tasks_per_node,
                                                   " adds up to more tasks than psflow runs in one cluster"));
  }
  const int total = *total_tasks;
  if (!step.num_tasks.empty() && ParseCount(step.num_tasks) != std::optional<int>(total)) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_NUM_TASKS=", step.num_tasks,
                                                   " but SLURM_STEP_TASKS_PER_NODE=", step.tasks_per_node,
                                                   " adds up to ", total, " tasks"));
  }
  const std::optional<int> rank = ParseCount(step.procid);
  if (!rank || *rank >= total) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_PROCID=", step.procid, " is not a rank of this step's ",
                                                   total, " tasks (0..", total - 1, ")"));
  }

  // The jobs, in rank order.
  std::vector<SlurmJob> jobs;
  const std::string jobs_flag(absl::StripAsciiWhitespace(ToAbsl(jobs_text)));
  if (jobs_flag.empty()) {
    if (total < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this Slurm step has 1 task but a cluster needs a ps and a worker: start it with srun -n2 or more"));
    }
    jobs = {{"ps", 1}, {"worker", total - 1}};
  } else {
    absl::StatusOr<std::vector<SlurmJob>> parsed = ParseSlurmJobs(jobs_flag);
    if (!parsed.ok()) return parsed.status();
    jobs = *std::move(parsed);
  }
  int wanted = 0;
  for (const SlurmJob& j : jobs) wanted += j.num_tasks;
  if (wanted != total) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm_jobs=", jobs_flag, " needs ", wanted,
                                                   " tasks but this Slurm step has ", total,
                                                   " (SLURM_STEP_TASKS_PER_NODE=", step.tasks_per_node,
                                                   "): start it with srun -n", wanted, ", or change --slurm_jobs"));
  }

  // Every task's address, in rank order: node by node, port_base + the task's rank on its node.
  std::vector<std::string> addresses;
  for (size_t node = 0; node < hosts->size(); ++node) {
    for (int local = 0; local < (*per_node)[node]; ++local) {
      const int port = port_base + local;
      if (port_base < 1 || port > 65535) {
        return absl::InvalidArgumentError(absl::StrCat("--slurm_port_base=", port_base, " gives task ", local,
                                                       " of node ", (*hosts)[node], " port ", port,
                                                       ", outside 1..65535: choose a lower --slurm_port_base"));
      }
      if (static_cast<int>(addresses.size()) == *rank) {
        // Slurm's default block distribution puts consecutive ranks on a node; check it did.
        const bool local_differs = !step.localid.empty() && ParseCount(step.localid) != std::optional<int>(local);
        const bool node_differs = !step.nodename.empty() && step.nodename != (*hosts)[node];
        if (local_differs || node_differs) {
          return absl::InvalidArgumentError(
              absl::StrCat("SLURM_PROCID=", *rank, " is task ", local, " of node ", (*hosts)[node],
                           " in block order, but Slurm placed it as task ", step.localid, " of node ", step.nodename,
                           ": start the step with srun --distribution=block"));
        }
      }
      addresses.push_back(absl::StrCat((*hosts)[node], ":", port));
    }
  }

  std::vector<std::string> ps, workers;
  TaskSpec task;
  int first = 0;
  for (const SlurmJob& j : jobs) {
    std::vector<std::string>& list = j.name == "ps" ? ps : workers;
    list.assign(addresses.begin() + first, addresses.begin() + first + j.num_tasks);
    if (*rank >= first && *rank < first + j.num_tasks) task = {j.name, *rank - first};
    first += j.num_tasks;
  }
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromHostLists(absl::StrJoin(ps, ","), absl::StrJoin(workers, ","));
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster of Slurm step SLURM_STEP_NODELIST=", step.nodelist, ": ", spec.status().message()));
  }
  return std::pair{*std::move(spec), std::move(task)};
}

}  // namespace psflow::dist
