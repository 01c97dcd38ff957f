// Tests of psflow/dist/slurm.h: the hostlist parser against Slurm's own `scontrol show hostnames`
// (and `scontrol show hostlist`, which compresses, for random round trips), the tasks-per-node
// parser against hand-expanded lists, and the step's cluster against TF's SlurmClusterResolver
// layout worked out by hand. The scontrol comparisons skip where slurm-wlm is not installed.
#include "psflow/dist/slurm.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psflow::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs `scontrol show <what> '<arg>'` against a one-line config (scontrol needs one even to expand
// names); returns its whitespace-split output, or nullopt when it failed (an invalid hostlist).
class Scontrol {
 public:
  Scontrol() {
    if (std::system("command -v scontrol > /dev/null 2>&1") != 0) return;
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("psflow_slurm_test_", getpid());
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "slurm.conf") << "ClusterName=t\nSlurmctldHost=localhost\n"
                                          "NodeName=localhost CPUs=1 State=UNKNOWN\n"
                                          "PartitionName=p Nodes=localhost Default=YES\n";
    available_ = true;
  }
  ~Scontrol() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  bool available() const { return available_; }

  std::optional<std::vector<std::string>> Run(const std::string& what, const std::string& arg) const {
    const std::string cmd =
        absl::StrCat("SLURM_CONF=", (dir_ / "slurm.conf").string(), " scontrol show ", what, " '", arg, "' 2>&1");
    FILE* pipe = popen(cmd.c_str(), "r");
    if (pipe == nullptr) return std::nullopt;
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
    const int status = pclose(pipe);
    if (status != 0 || absl::StrContains(out, "Invalid hostlist") || absl::StrContains(out, "error"))
      return std::nullopt;
    return std::vector<std::string>(absl::StrSplit(out, absl::ByAnyChar(" \n"), absl::SkipEmpty()));
  }

 private:
  std::filesystem::path dir_;
  bool available_ = false;
};

const Scontrol& GetScontrol() {
  static const Scontrol* s = new Scontrol();
  return *s;
}

TEST(ExpandHostlistTest, HandExpandedExamples) {
  EXPECT_THAT(*ExpandHostlist("n[01-03,7],m5"), ElementsAre("n01", "n02", "n03", "n7", "m5"));
  EXPECT_THAT(*ExpandHostlist("localhost"), ElementsAre("localhost"));
  EXPECT_THAT(*ExpandHostlist("n[08-10]"), ElementsAre("n08", "n09", "n10"));
  EXPECT_THAT(*ExpandHostlist("n[9-11]"), ElementsAre("n9", "n10", "n11"));
  EXPECT_THAT(*ExpandHostlist("rack[1-2]-n[1-2]"), ElementsAre("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"));
  EXPECT_THAT(*ExpandHostlist(" a , b[2] "), ElementsAre("a", "b2"));
  EXPECT_TRUE(ExpandHostlist("")->empty());
}

// The strings scontrol accepts expand exactly as it expands them.
TEST(ExpandHostlistTest, SameAsScontrolShowHostnames) {
  if (!GetScontrol().available()) GTEST_SKIP() << "scontrol not installed (apt-get install slurm-wlm)";
  for (const char* s : {"n[01-03,7],m5",
                        "localhost",
                        "n[001-3]",
                        "n[9-11]",
                        "n[1-3],n[5]",
                        "rack[1-2]-n[1-2]",
                        "a[1-2]b[3-4]",
                        "n[01-10]",
                        "n[0010-12]",
                        "n[1,1,2]",
                        "n[01-2]",
                        "n[1-02]",
                        "n1,,n2",
                        "[1-3]",
                        "n-[1-2]",
                        "N[1-2],x",
                        "gpu-node[000-127]",
                        "c[1-4,6,8-9],gpu[01-02],login1",
                        "n[09-11],m[099-101]",
                        "n[0-0]"}) {
    SCOPED_TRACE(s);
    const auto expected = GetScontrol().Run("hostnames", s);
    ASSERT_TRUE(expected.has_value()) << "scontrol refused it";
    absl::StatusOr<std::vector<std::string>> got = ExpandHostlist(s);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *expected);
  }
}

// Strings scontrol refuses are errors here too, naming the piece.
TEST(ExpandHostlistTest, RefusesWhatScontrolRefuses) {
  for (const char* s : {"n[3-1]", "n[a-b]", "n[]", "n[1-2]x", "n[1-2]-ib", "n[1-2],x[3]y", "n[1-100000]"}) {
    SCOPED_TRACE(s);
    if (GetScontrol().available()) {
      EXPECT_FALSE(GetScontrol().Run("hostnames", s).has_value()) << "scontrol accepts it";
    }
    absl::StatusOr<std::vector<std::string>> got = ExpandHostlist(s);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr("is not a Slurm hostlist"));
  }
  EXPECT_THAT(ExpandHostlist("n[1-3").status().message(), HasSubstr("'[' without its ']'"));
  EXPECT_THAT(ExpandHostlist("n[3-1]").status().message(), HasSubstr("range \"3-1\""));
}

// Random host sets compressed by Slurm (`scontrol show hostlist`) expand back to what Slurm expands.
TEST(ExpandHostlistTest, RoundTripsScontrolCompression) {
  if (!GetScontrol().available()) GTEST_SKIP() << "scontrol not installed (apt-get install slurm-wlm)";
  std::mt19937 rng(20);
  for (int trial = 0; trial < 25; ++trial) {
    std::vector<std::string> names;
    const int n = 1 + rng() % 12;
    for (int i = 0; i < n; ++i) {
      const char* prefixes[] = {"n", "gpu", "c-", "node"};
      const int width = 1 + rng() % 3;
      std::string num = absl::StrCat(rng() % 120);
      if (static_cast<int>(num.size()) < width) num.insert(0, width - num.size(), '0');
      names.push_back(absl::StrCat(prefixes[rng() % 4], num));
    }
    const std::string plain = absl::StrJoin(names, ",");
    SCOPED_TRACE(plain);
    const auto compressed = GetScontrol().Run("hostlist", plain);
    ASSERT_TRUE(compressed.has_value() && compressed->size() == 1);
    const auto expected = GetScontrol().Run("hostnames", compressed->front());
    ASSERT_TRUE(expected.has_value());
    absl::StatusOr<std::vector<std::string>> got = ExpandHostlist(compressed->front());
    ASSERT_TRUE(got.ok()) << compressed->front() << ": " << got.status();
    EXPECT_EQ(*got, *expected) << compressed->front();
  }
}

TEST(ExpandTasksPerNodeTest, HandExpandedExamples) {
  EXPECT_THAT(*ExpandTasksPerNode("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(*ExpandTasksPerNode("3"), ElementsAre(3));
  EXPECT_THAT(*ExpandTasksPerNode("1,4(x2),2(x1)"), ElementsAre(1, 4, 4, 2));
  for (const char* bad : {"", "0", "2(x0)", "2(3)", "x", "2(x3", "-1", "2,,1"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<std::vector<int>> got = ExpandTasksPerNode(bad);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr("is not Slurm's tasks per node"));
  }
}

TEST(ParseSlurmJobsTest, JobsInOrder) {
  EXPECT_THAT(*ParseSlurmJobs("ps:2,worker:6"), ElementsAre(SlurmJob{"ps", 2}, SlurmJob{"worker", 6}));
  EXPECT_THAT(*ParseSlurmJobs("worker:3, ps:1"), ElementsAre(SlurmJob{"worker", 3}, SlurmJob{"ps", 1}));
  EXPECT_THAT(ParseSlurmJobs("ps:1").status().message(), HasSubstr("no worker job"));
  EXPECT_THAT(ParseSlurmJobs("ps:1,worker:0").status().message(), HasSubstr("\"worker:0\" is not JOB:N"));
  EXPECT_THAT(ParseSlurmJobs("ps:1,chief:1,worker:2").status().message(), HasSubstr("unknown job \"chief\""));
  EXPECT_THAT(ParseSlurmJobs("ps:1,worker:2,ps:1").status().message(), HasSubstr("listed twice"));
}

SlurmStep Step(std::string nodelist, std::string per_node, int rank) {
  SlurmStep s;
  s.nodelist = std::move(nodelist);
  s.tasks_per_node = std::move(per_node);
  s.procid = absl::StrCat(rank);
  return s;
}

// TF's layout: tasks node by node, ports from the base up on each node; ranks fill the jobs in order.
TEST(ClusterFromSlurmTest, RanksFillJobsInOrder) {
  const std::vector<std::string> ps = {"n01:7000", "n01:7001"};
  const std::vector<std::string> workers = {"n02:7000", "n02:7001", "n03:7000", "n03:7001", "n7:7000", "m5:7000"};
  for (int rank = 0; rank < 8; ++rank) {
    SlurmStep step = Step("n[01-03,7],m5", "2(x3),1(x2)", rank);
    step.num_tasks = "8";
    step.localid = absl::StrCat(rank < 6 ? rank % 2 : 0);
    auto got = ClusterFromSlurm(step, "ps:2,worker:6", 7000);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->first.ps(), ps);
    EXPECT_EQ(got->first.workers(), workers);
    EXPECT_EQ(got->second, (rank < 2 ? TaskSpec{"ps", rank} : TaskSpec{"worker", rank - 2}));
  }
  // Workers listed first take the first ranks.
  auto flipped = ClusterFromSlurm(Step("a,b", "2,1", 2), "worker:2,ps:1", 8888);
  ASSERT_TRUE(flipped.ok()) << flipped.status();
  EXPECT_THAT(flipped->first.workers(), ElementsAre("a:8888", "a:8889"));
  EXPECT_THAT(flipped->first.ps(), ElementsAre("b:8888"));
  EXPECT_EQ(flipped->second, (TaskSpec{"ps", 0}));
}

TEST(ClusterFromSlurmTest, DefaultIsOnePsAndTheRestWorkers) {
  auto got = ClusterFromSlurm(Step("localhost", "3", 1), "", kDefaultSlurmPortBase);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->first.ps(), ElementsAre("localhost:8888"));
  EXPECT_THAT(got->first.workers(), ElementsAre("localhost:8889", "localhost:8890"));
  EXPECT_EQ(got->second, (TaskSpec{"worker", 0}));
  EXPECT_THAT(ClusterFromSlurm(Step("localhost", "1", 0), "", 8888).status().message(),
              HasSubstr("this Slurm step has 1 task but a cluster needs a ps and a worker"));
}

TEST(ClusterFromSlurmTest, OneLineErrors) {
  EXPECT_EQ(ClusterFromSlurm(Step("localhost", "4", 0), "ps:1,worker:2", 8888).status().message(),
            "--slurm_jobs=ps:1,worker:2 needs 3 tasks but this Slurm step has 4 (SLURM_STEP_TASKS_PER_NODE=4): "
            "start it with srun -n3, or change --slurm_jobs");
  EXPECT_THAT(ClusterFromSlurm(Step("n[1-3]", "2(x2)", 0), "", 8888).status().message(),
              HasSubstr("names 3 nodes but SLURM_STEP_TASKS_PER_NODE=2(x2) gives 2"));
  EXPECT_THAT(ClusterFromSlurm(Step("n[1-", "1", 0), "", 8888).status().message(),
              HasSubstr("SLURM_STEP_NODELIST=\"n[1-\" is not a Slurm hostlist"));
  EXPECT_THAT(ClusterFromSlurm(Step("n1", "3", 3), "", 8888).status().message(),
              HasSubstr("SLURM_PROCID=3 is not a rank of this step's 3 tasks"));
  EXPECT_THAT(ClusterFromSlurm(Step("n1", "3", 0), "", 65534).status().message(),
              HasSubstr("port 65536, outside 1..65535"));
  SlurmStep cyclic = Step("n[1-2]", "2(x2)", 1);  // block order: task 1 of n1; cyclic put it on n2
  cyclic.localid = "0";
  cyclic.nodename = "n2";
  EXPECT_THAT(ClusterFromSlurm(cyclic, "", 8888).status().message(),
              HasSubstr("start the step with srun --distribution=block"));
  SlurmStep counted = Step("n1", "3", 0);
  counted.num_tasks = "4";
  EXPECT_THAT(ClusterFromSlurm(counted, "", 8888).status().message(),
              HasSubstr("SLURM_STEP_NUM_TASKS=4 but SLURM_STEP_TASKS_PER_NODE=3 adds up to 3"));
}

// Where the cluster comes from when several sources are present.
TEST(ResolveClusterSlurmTest, Precedence) {
  const SlurmStep step = Step("localhost", "3", 2);
  ClusterSources src;
  src.slurm = &step;
  auto from_slurm = ResolveCluster(src);
  ASSERT_TRUE(from_slurm.ok()) << from_slurm.status();
  EXPECT_EQ(from_slurm->second, (TaskSpec{"worker", 1}));

  // Flags or TF_CONFIG win over the step's environment...
  src.ps_hosts = "127.0.0.1:1";
  src.worker_hosts = "127.0.0.1:2";
  src.job_name = "worker";
  auto from_flags = ResolveCluster(src);
  ASSERT_TRUE(from_flags.ok()) << from_flags.status();
  EXPECT_THAT(from_flags->first.ps(), ElementsAre("127.0.0.1:1"));
  // ...but not over --slurm_jobs, which asks for Slurm's cluster explicitly.
  src.slurm_jobs = "ps:1,worker:2";
  EXPECT_THAT(ResolveCluster(src).status().message(),
              HasSubstr("the cluster is given twice, by --slurm_jobs=ps:1,worker:2 and by --ps_hosts/--worker_hosts"));

  // A one-task step trains in one process; with --slurm_jobs it is a (too small) cluster.
  const SlurmStep one = Step("localhost", "1", 0);
  ClusterSources single;
  single.slurm = &one;
  auto alone = ResolveCluster(single);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE(alone->first.empty());
  single.slurm_jobs = "ps:1,worker:1";
  EXPECT_THAT(ResolveCluster(single).status().message(), HasSubstr("needs 2 tasks but this Slurm step has 1"));

  // --slurm_jobs outside a step; a --job_name that disagrees with the rank.
  ClusterSources outside;
  outside.slurm_jobs = "ps:1,worker:2";
  EXPECT_THAT(ResolveCluster(outside).status().message(), HasSubstr("is not a task of a Slurm job step"));
  ClusterSources disagree;
  disagree.slurm = &step;
  disagree.job_name = "ps";
  EXPECT_THAT(ResolveCluster(disagree).status().message(), HasSubstr("disagree with this Slurm task's role (worker 1"));
}

}  // namespace
}  // namespace psflow::dist
