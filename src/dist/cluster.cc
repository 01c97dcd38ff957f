// psflow/dist/cluster.cc — ClusterSpec parsing (flags and TF_CONFIG) and validation.
#include "psflow/dist/cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "nlohmann/json.hpp"
#include "psflow/dist/slurm.h"

namespace psflow::dist {
namespace {

// Debian's abseil has its own absl::string_view (not std::string_view): convert at the API edge.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// One address together with where it came from ("--ps_hosts entry 1", "TF_CONFIG cluster.ps[1]"),
// so every error can point at the exact item.
struct SourcedAddress {
  std::string address;
  std::string where;
};

bool IsHostNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_'; }
// Inside [...]: an IPv6 address, optionally with a %zone suffix.
bool IsBracketedHostChar(char c) { return absl::ascii_isalnum(c) || c == ':' || c == '.' || c == '%'; }

// Checks one "host:port" item; `where` names it in the error.
absl::Status CheckAddress(absl::string_view item, const std::string& where) {
  const std::string quoted = absl::StrCat(where, " \"", item, "\"");
  // No host name starts with '-': this is the next flag, taken as the value of an empty
  // "--worker_hosts=" by the command-line parser.
  if (absl::StartsWith(item, "-")) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted,
                     " is a flag, not host:port: a host list given empty (e.g. --worker_hosts=) takes the next "
                     "argument as its value; give it host:port, or leave the flag out"));
  }
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(item, "[")) {
    const size_t close = item.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(quoted, " has no closing ']': write IPv6 addresses as [addr]:port, e.g. [::1]:2222"));
    }
    host = item.substr(1, close - 1);
    absl::string_view rest = item.substr(close + 1);
    if (!absl::StartsWith(rest, ":")) {
      return absl::InvalidArgumentError(absl::StrCat(quoted, " has no port: write [addr]:port, e.g. [::1]:2222"));
    }
    port = rest.substr(1);
    for (char c : host) {
      if (!IsBracketedHostChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat(quoted, " has an invalid character '", std::string(1, c), "' in its IPv6 host"));
      }
    }
  } else {
    const size_t colons = std::count(item.begin(), item.end(), ':');
    if (colons == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(quoted, " has no port: write host:port, e.g. ", item.empty() ? "localhost" : item, ":2222"));
    }
    if (colons > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          quoted, " has more than one ':': write host:port, and IPv6 addresses in brackets, e.g. [::1]:2222"));
    }
    const size_t colon = item.find(':');
    host = item.substr(0, colon);
    port = item.substr(colon + 1);
    for (char c : host) {
      if (!IsHostNameChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat(quoted, " has an invalid character '", std::string(1, c),
                         "' in its host: hosts are names or IP addresses (letters, digits, '-', '.', '_')"));
      }
    }
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, " has an empty host: write host:port, e.g. localhost", item));
  }
  if (port.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, " has an empty port: write host:port, e.g. ", host, ":2222"));
  }
  int value = 0;
  const bool digits_only = std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); });
  if (!digits_only || port.size() > 5 || !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, " has port \"", port, "\": the port must be a number in 1..65535"));
  }
  return absl::OkStatus();
}

// Splits a flag value "a:1, b:2" into trimmed items; "" -> no items.
absl::StatusOr<std::vector<SourcedAddress>> SplitHostList(absl::string_view list, absl::string_view flag) {
  std::vector<SourcedAddress> out;
  if (absl::StripAsciiWhitespace(list).empty()) return out;
  int index = 0;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::string where = absl::StrCat(flag, " entry ", index);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is empty: remove the extra comma from ", flag, "=", list));
    }
    out.push_back({std::string(item), std::move(where)});
    ++index;
  }
  return out;
}

// Checks every address, refuses duplicates across the whole cluster and workers without ps.
absl::Status Assemble(const std::vector<SourcedAddress>& ps, const std::vector<SourcedAddress>& workers,
                      absl::string_view no_ps_error, std::vector<std::string>* ps_out,
                      std::vector<std::string>* workers_out) {
  std::map<std::string, const SourcedAddress*> seen;  // lower-cased address -> first occurrence
  for (const auto* list : {&ps, &workers}) {
    for (const SourcedAddress& a : *list) {
      if (absl::Status s = CheckAddress(a.address, a.where); !s.ok()) return s;
      auto [it, inserted] = seen.emplace(absl::AsciiStrToLower(a.address), &a);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("address ", a.address, " appears twice (", it->second->where,
                                                       " and ", a.where, "): give every task its own host:port"));
      }
    }
  }
  if (ps.empty() && !workers.empty()) return absl::InvalidArgumentError(no_ps_error);
  for (const SourcedAddress& a : ps) ps_out->push_back(a.address);
  for (const SourcedAddress& a : workers) workers_out->push_back(a.address);
  return absl::OkStatus();
}

std::string CountTasks(int n, absl::string_view singular, absl::string_view plural) {
  if (n == 1) return absl::StrCat("1 ", singular, " (index 0)");
  if (n == 0) return absl::StrCat("no ", plural);
  return absl::StrCat(n, " ", plural, " (indices 0..", n - 1, ")");
}

// Reads the list cluster[key] of TF_CONFIG as addresses.
absl::Status ReadTfConfigList(const nlohmann::json& cluster, const std::string& key, std::vector<SourcedAddress>* out) {
  auto it = cluster.find(key);
  if (it == cluster.end()) return absl::OkStatus();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG cluster.", key, " is not a list: write \"", key, "\": [\"host:port\", ...]"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& item = (*it)[i];
    std::string where = absl::StrCat("TF_CONFIG cluster.", key, "[", i, "]");
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is not a string: write \"host:port\""));
    }
    const std::string& text = item.get_ref<const std::string&>();
    out->push_back({std::string(absl::StripAsciiWhitespace(text)), std::move(where)});
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t Fnv1a64(std::string_view text) {
  // Hand-written because the fingerprint must be identical in every process and build; absl::Hash is
  // deliberately salted per process. FNV-1a 64-bit offset basis and prime.
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromHostLists(std::string_view ps_hosts_in, std::string_view worker_hosts_in) {
  const absl::string_view ps_hosts = ToAbsl(ps_hosts_in), worker_hosts = ToAbsl(worker_hosts_in);
  absl::StatusOr<std::vector<SourcedAddress>> ps = SplitHostList(ps_hosts, "--ps_hosts");
  if (!ps.ok()) return ps.status();
  absl::StatusOr<std::vector<SourcedAddress>> workers = SplitHostList(worker_hosts, "--worker_hosts");
  if (!workers.ok()) return workers.status();
  ClusterSpec spec;
  const std::string no_ps = absl::StrCat("--worker_hosts lists ", workers->size(),
                                         " worker(s) but --ps_hosts is empty: give at least one ps, "
                                         "e.g. --ps_hosts=localhost:2222");
  if (absl::Status s = Assemble(*ps, *workers, no_ps, &spec.ps_, &spec.workers_); !s.ok()) return s;
  return spec;
}

absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ClusterSpec::FromTfConfig(std::string_view json) {
  nlohmann::json root;
  try {  // nlohmann reports the position of a syntax error only through its exception
    root = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG is not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object())
    return absl::InvalidArgumentError("TF_CONFIG is not a JSON object: expected {\"cluster\": ..., \"task\": ...}");
  auto cluster_it = root.find("cluster");
  if (cluster_it == root.end() || !cluster_it->is_object()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG has no \"cluster\" object: expected {\"cluster\": {\"worker\": [...], \"ps\": [...]}, ...}");
  }
  const nlohmann::json& cluster = *cluster_it;
  for (const auto& [key, value] : cluster.items()) {
    if (key != "chief" && key != "worker" && key != "ps" && key != "evaluator") {
      return absl::InvalidArgumentError(
          absl::StrCat("TF_CONFIG cluster job \"", key, "\" is unsupported: psflow runs chief, worker and ps tasks"));
    }
  }
  std::vector<SourcedAddress> chief, worker, ps;
  const std::pair<const char*, std::vector<SourcedAddress>*> lists[] = {
      {"chief", &chief}, {"worker", &worker}, {"ps", &ps}};
  for (auto [key, list] : lists) {
    if (absl::Status s = ReadTfConfigList(cluster, key, list); !s.ok()) return s;
  }
  if (chief.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG cluster.chief lists ", chief.size(), " addresses: there is at most one chief"));
  }

  auto task_it = root.find("task");
  if (task_it == root.end() || !task_it->is_object()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG has no \"task\" object: add \"task\": {\"type\": \"worker\", \"index\": 0}");
  }
  auto type_it = task_it->find("type");
  if (type_it == task_it->end() || !type_it->is_string()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG task has no \"type\" string: use \"chief\", \"worker\", \"ps\" or \"evaluator\"");
  }
  auto index_it = task_it->find("index");
  if (index_it == task_it->end() || !index_it->is_number_integer()) {
    return absl::InvalidArgumentError("TF_CONFIG task has no integer \"index\": add e.g. \"index\": 0");
  }
  const std::string type = type_it->get<std::string>();
  const int64_t index = index_it->get<int64_t>();
  const int has_chief = chief.empty() ? 0 : 1;

  auto out_of_range = [&](absl::string_view job, size_t n, absl::string_view singular, absl::string_view plural) {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG task ", job, " index ", index,
                                                   " is out of range: cluster.", job, " lists ",
                                                   CountTasks(static_cast<int>(n), singular, plural)));
  };
  TaskSpec task;
  if (type == "chief") {
    if (!has_chief)
      return absl::InvalidArgumentError("TF_CONFIG task type is \"chief\" but cluster.chief is missing or empty");
    if (index != 0) return out_of_range("chief", chief.size(), "chief", "chiefs");
    task = {"worker", 0};
  } else if (type == "worker") {
    if (index < 0 || index >= static_cast<int64_t>(worker.size()))
      return out_of_range("worker", worker.size(), "worker", "workers");
    task = {"worker", static_cast<int>(index) + has_chief};
  } else if (type == "ps") {
    if (index < 0 || index >= static_cast<int64_t>(ps.size()))
      return out_of_range("ps", ps.size(), "ps task", "ps tasks");
    task = {"ps", static_cast<int>(index)};
  } else if (type == "evaluator") {
    // The evaluator reads the chief's checkpoints and talks to no task: the cluster is not its concern.
    if (index != 0) {
      return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG task evaluator index ", index,
                                                     " is out of range: a job has one evaluator (index 0)"));
    }
    return std::pair{ClusterSpec(), TaskSpec{"evaluator", 0}};
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "TF_CONFIG task type \"", type, "\" is unsupported: psflow runs chief, worker, ps and evaluator tasks"));
  }

  std::vector<SourcedAddress> workers = chief;
  workers.insert(workers.end(), worker.begin(), worker.end());
  if (workers.empty()) {  // only a ps task gets here: nobody would ever call it
    return absl::InvalidArgumentError(
        "TF_CONFIG cluster has no chief and no worker: a ps task serves workers; add \"worker\": [\"host:port\", ...]");
  }
  ClusterSpec spec;
  if (absl::Status s =
          Assemble(ps, workers, "TF_CONFIG cluster has workers but no ps: add \"ps\": [\"host:port\", ...]", &spec.ps_,
                   &spec.workers_);
      !s.ok()) {
    return s;
  }
  return std::pair{std::move(spec), std::move(task)};
}

const std::string& ClusterSpec::address(const TaskSpec& task) const {
  CHECK(Validate(task).ok()) << "ClusterSpec::address on an invalid task: " << Validate(task).message();
  return task.job == "ps" ? ps_[task.index] : workers_[task.index];
}

absl::Status ClusterSpec::Validate(const TaskSpec& task) const {
  if (task.job != "ps" && task.job != "worker") {
    if (task.job.empty())
      return absl::InvalidArgumentError("--job_name is missing: use --job_name=ps or --job_name=worker");
    return absl::InvalidArgumentError(
        absl::StrCat("--job_name=", task.job, " is not a job of the cluster: use --job_name=ps or --job_name=worker"));
  }
  const bool is_ps = task.job == "ps";
  const int n = is_ps ? num_ps() : num_workers();
  const absl::string_view flag = is_ps ? "--ps_hosts" : "--worker_hosts";
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--job_name=", task.job, " but ", flag, " is empty: list this task's host:port in ", flag));
  }
  if (task.index < 0 || task.index >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--task_index=", task.index, " is out of range: ", flag, " lists ",
                     is_ps ? CountTasks(n, "ps task", "ps tasks") : CountTasks(n, "worker", "workers")));
  }
  return absl::OkStatus();
}

std::string ClusterSpec::ToString() const {
  return absl::StrCat("ps=", absl::StrJoin(ps_, ","), ";worker=", absl::StrJoin(workers_, ","));
}

uint64_t ClusterSpec::Fingerprint() const { return Fnv1a64(ToString()); }

absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ResolveCluster(std::string_view ps_hosts_in,
                                                                std::string_view worker_hosts_in,
                                                                std::string_view job_name_in, int task_index,
                                                                std::string_view tf_config_in) {
  ClusterSources sources;
  sources.ps_hosts = ps_hosts_in;
  sources.worker_hosts = worker_hosts_in;
  sources.job_name = job_name_in;
  sources.task_index = task_index;
  sources.tf_config = tf_config_in;
  return ResolveCluster(sources);
}

absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> ResolveCluster(const ClusterSources& sources) {
  const std::string_view ps_hosts_in = sources.ps_hosts, worker_hosts_in = sources.worker_hosts,
                         tf_config_in = sources.tf_config;
  const int task_index = sources.task_index;
  const absl::string_view ps_hosts = ToAbsl(ps_hosts_in), worker_hosts = ToAbsl(worker_hosts_in),
                          job_name = ToAbsl(sources.job_name), tf_config_env = ToAbsl(tf_config_in),
                          slurm_jobs = absl::StripAsciiWhitespace(ToAbsl(sources.slurm_jobs));
  const bool flags_given =
      !absl::StripAsciiWhitespace(ps_hosts).empty() || !absl::StripAsciiWhitespace(worker_hosts).empty();
  const bool tf_config_given = !absl::StripAsciiWhitespace(tf_config_env).empty();
  if (flags_given && tf_config_given) {
    return absl::InvalidArgumentError(
        "the cluster is given twice, by --ps_hosts/--worker_hosts and by the TF_CONFIG environment variable: "
        "drop the flags or unset TF_CONFIG");
  }
  if (!slurm_jobs.empty() && (flags_given || tf_config_given)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cluster is given twice, by --slurm_jobs=", slurm_jobs, " and by ",
        flags_given ? "--ps_hosts/--worker_hosts" : "the TF_CONFIG environment variable", ": drop one of them"));
  }
  if (!slurm_jobs.empty() && sources.slurm == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--slurm_jobs=", slurm_jobs,
        " but this process is not a task of a Slurm job step (SLURM_PROCID or SLURM_STEP_NODELIST is unset): "
        "start the tasks with srun, or drop --slurm_jobs"));
  }
  // The evaluator (programs/eval/evaluator.h) reads checkpoints only; the cluster, if given, is not its concern.
  if (job_name == "evaluator" && !tf_config_given) {
    if (task_index != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_name=evaluator --task_index=", task_index, ": a job has one evaluator, index 0"));
    }
    return std::pair{ClusterSpec(), TaskSpec{"evaluator", 0}};
  }
  // A one-task step (an interactive `srun --pty bash`, `srun -n1 psflow train`) trains in one
  // process unless --slurm_jobs asks for its cluster; a step whose task count does not parse is
  // reported by ClusterFromSlurm.
  const bool from_slurm = !flags_given && !tf_config_given && sources.slurm != nullptr &&
                          (!slurm_jobs.empty() || sources.slurm->TotalTasks() != std::optional<int>(1));
  if (from_slurm) {
    auto resolved = ClusterFromSlurm(*sources.slurm, sources.slurm_jobs, sources.slurm_port_base);
    if (!resolved.ok()) return resolved.status();
    const TaskSpec& task = resolved->second;
    if ((!job_name.empty() && job_name != task.job) || (task_index != 0 && task_index != task.index)) {
      return absl::InvalidArgumentError(absl::StrCat("--job_name=", job_name, " --task_index=", task_index,
                                                     " disagree with this Slurm task's role (", task.job, " ",
                                                     task.index, " for SLURM_PROCID=", sources.slurm->procid,
                                                     " under --slurm_jobs): drop --job_name and --task_index"));
    }
    return resolved;
  }
  if (flags_given) {
    absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromHostLists(ps_hosts_in, worker_hosts_in);
    if (!spec.ok()) return spec.status();
    TaskSpec task{std::string(job_name), task_index};
    if (absl::Status s = spec->Validate(task); !s.ok()) return s;
    // Without workers no chief would ever initialize the ps: it would only wait and time out.
    if (spec->num_workers() == 0) {
      return absl::InvalidArgumentError(
          "--worker_hosts is empty: a ps task serves workers; list every worker's host:port in --worker_hosts");
    }
    return std::pair{*std::move(spec), std::move(task)};
  }
  if (tf_config_given) {
    absl::StatusOr<std::pair<ClusterSpec, TaskSpec>> resolved = ClusterSpec::FromTfConfig(tf_config_in);
    if (!resolved.ok()) return resolved.status();
    const TaskSpec& task = resolved->second;
    const bool job_conflict = !job_name.empty() && job_name != task.job;
    const bool index_conflict = task_index != 0 && task_index != task.index;
    if (job_conflict || index_conflict) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job_name=", job_name, " --task_index=", task_index, " disagree with the TF_CONFIG environment variable (",
          task.job, " ", task.index, " after mapping a chief to worker 0): drop the flags or fix TF_CONFIG"));
    }
    return resolved;
  }
  if ((!job_name.empty() && job_name != "worker") || task_index != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--job_name=", job_name, " --task_index=", task_index,
                     " given without a cluster: set --ps_hosts and --worker_hosts "
                     "(or TF_CONFIG, or start the tasks with srun), or drop them for single-process training"));
  }
  return std::pair{ClusterSpec(), TaskSpec{"worker", 0}};
}

bool IsLoopbackHost(std::string_view host_port) {
  absl::string_view host = absl::StripAsciiWhitespace(ToAbsl(host_port));
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }  // several ':' and no brackets: a bare IPv6 address
  if (const size_t zone = host.find('%'); zone != absl::string_view::npos) host = host.substr(0, zone);
  const std::string h = absl::AsciiStrToLower(host);
  if (h == "localhost") return true;
  // inet_pton rather than hand parsing: it accepts exactly the standard textual forms.
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace psflow::dist
