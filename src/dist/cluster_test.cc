// Tests of ClusterSpec parsing (flags and TF_CONFIG), validation, fingerprints and IsLoopbackHost.
#include "psflow/dist/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace psflow::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every error must be one line.
void ExpectOneLineError(const absl::Status& s) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message().find('\n'), std::string_view::npos) << s.message();
}

TEST(ClusterSpecTest, ParsesHostLists) {
  auto spec = ClusterSpec::FromHostLists("ps0:2222, ps1:2223", "w0:2224,w1:2225,[::1]:2226");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->ps(), ElementsAre("ps0:2222", "ps1:2223"));
  EXPECT_THAT(spec->workers(), ElementsAre("w0:2224", "w1:2225", "[::1]:2226"));
  EXPECT_EQ(spec->num_ps(), 2);
  EXPECT_EQ(spec->num_workers(), 3);
  EXPECT_FALSE(spec->empty());
  EXPECT_EQ(spec->address({"ps", 1}), "ps1:2223");
  EXPECT_EQ(spec->address({"worker", 0}), "w0:2224");
  EXPECT_EQ(spec->ToString(), "ps=ps0:2222,ps1:2223;worker=w0:2224,w1:2225,[::1]:2226");
}

TEST(ClusterSpecTest, EmptyListsAreTheEmptyCluster) {
  auto spec = ClusterSpec::FromHostLists("", "  ");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->empty());
  EXPECT_EQ(spec->ToString(), "ps=;worker=");
  // A ps-only cluster (e.g. a transport benchmark against a ps) is allowed.
  auto ps_only = ClusterSpec::FromHostLists("localhost:1", "");
  ASSERT_TRUE(ps_only.ok());
  EXPECT_EQ(ps_only->num_ps(), 1);
  EXPECT_EQ(ps_only->num_workers(), 0);
}

struct BadListCase {
  std::string ps, workers;
  std::vector<std::string> must_mention;
};

TEST(ClusterSpecTest, RejectsMalformedListsNamingTheItem) {
  const std::vector<BadListCase> cases = {
      {"localhost", "", {"--ps_hosts entry 0", "\"localhost\"", "no port", "localhost:2222"}},
      {"a:1", "b:2,c", {"--worker_hosts entry 1", "\"c\"", "no port"}},
      {":2222", "", {"--ps_hosts entry 0", "empty host"}},
      {"a:", "", {"--ps_hosts entry 0", "empty port"}},
      {"a:0", "", {"\"a:0\"", "1..65535"}},
      {"a:65536", "", {"\"a:65536\"", "1..65535"}},
      {"a:-1", "", {"\"a:-1\"", "1..65535"}},
      {"a:12x", "", {"\"a:12x\"", "1..65535"}},
      {"a:1,,b:2", "", {"--ps_hosts entry 1", "empty", "extra comma"}},
      {"a:1,", "", {"--ps_hosts entry 1", "empty"}},
      {"::1:2222", "", {"more than one ':'", "[::1]:2222"}},
      {"[::1:2222", "", {"closing ']'"}},
      {"[::1]", "", {"no port"}},
      {"a b:1", "", {"invalid character"}},
      {"a:1", "a:1", {"a:1 appears twice", "--ps_hosts entry 0", "--worker_hosts entry 0"}},
      {"a:1,b:1,A:1", "", {"appears twice", "--ps_hosts entry 0", "--ps_hosts entry 2"}},
      {"", "w:1,w:2", {"--worker_hosts lists 2", "--ps_hosts is empty"}},
      {"127.0.0.1:99999", "", {"--ps_hosts entry 0", "\"127.0.0.1:99999\"", "1..65535"}},
      {"127.0.0.1:", "", {"--ps_hosts entry 0", "empty port", "127.0.0.1:2222"}},
      {":5000", "", {"--ps_hosts entry 0", "empty host"}},
      {"127.0.0.1:1,127.0.0.1:2",
       "127.0.0.1:3,127.0.0.1:2",
       {"127.0.0.1:2 appears twice", "--ps_hosts entry 1", "--worker_hosts entry 1"}},
      // An empty "--worker_hosts=" swallows the next flag as its value.
      {"p:1", "--init_timeout_secs=2", {"--worker_hosts entry 0", "is a flag, not host:port", "--worker_hosts="}},
  };
  for (const BadListCase& c : cases) {
    auto spec = ClusterSpec::FromHostLists(c.ps, c.workers);
    ASSERT_FALSE(spec.ok()) << "ps=" << c.ps << " workers=" << c.workers;
    ExpectOneLineError(spec.status());
    for (const std::string& word : c.must_mention) {
      EXPECT_THAT(std::string(spec.status().message()), HasSubstr(word)) << "ps=" << c.ps << " workers=" << c.workers;
    }
  }
}

TEST(ClusterSpecTest, ValidatesTasks) {
  auto spec = ClusterSpec::FromHostLists("p:1", "w:2,w:3");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->Validate({"ps", 0}).ok());
  EXPECT_TRUE(spec->Validate({"worker", 1}).ok());

  absl::Status s = spec->Validate({"worker", 3});
  EXPECT_EQ(s.message(), "--task_index=3 is out of range: --worker_hosts lists 2 workers (indices 0..1)");
  s = spec->Validate({"ps", 1});
  EXPECT_EQ(s.message(), "--task_index=1 is out of range: --ps_hosts lists 1 ps task (index 0)");
  s = spec->Validate({"worker", -1});
  EXPECT_THAT(std::string(s.message()), HasSubstr("--task_index=-1 is out of range"));
  s = spec->Validate({"chief", 0});
  EXPECT_THAT(std::string(s.message()), HasSubstr("--job_name=chief is not a job"));
  s = spec->Validate({"", 0});
  EXPECT_THAT(std::string(s.message()), HasSubstr("--job_name is missing"));

  auto ps_only = ClusterSpec::FromHostLists("p:1", "");
  ASSERT_TRUE(ps_only.ok());
  s = ps_only->Validate({"worker", 0});
  EXPECT_THAT(std::string(s.message()), HasSubstr("--worker_hosts is empty"));
  // A ps task nobody would ever call is refused rather than left waiting for a chief.
  auto lonely_ps = ResolveCluster("p:1", "", "ps", 0, "");
  ASSERT_FALSE(lonely_ps.ok());
  ExpectOneLineError(lonely_ps.status());
  EXPECT_THAT(std::string(lonely_ps.status().message()),
              HasSubstr("--worker_hosts is empty: a ps task serves workers"));
  auto tf_lonely_ps =
      ResolveCluster("", "", "", 0, R"({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}})");
  ASSERT_FALSE(tf_lonely_ps.ok());
  EXPECT_THAT(std::string(tf_lonely_ps.status().message()), HasSubstr("TF_CONFIG cluster has no chief and no worker"));
}

TEST(ClusterSpecTest, FingerprintDistinguishesClusters) {
  auto a = ClusterSpec::FromHostLists("p:1,p:2", "w:3");
  auto b = ClusterSpec::FromHostLists(" p:1 , p:2", "w:3 ");
  auto swapped = ClusterSpec::FromHostLists("p:2,p:1", "w:3");
  auto moved = ClusterSpec::FromHostLists("p:1", "p:2,w:3");
  ASSERT_TRUE(a.ok() && b.ok() && swapped.ok() && moved.ok());
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  EXPECT_NE(a->Fingerprint(), swapped->Fingerprint());
  EXPECT_NE(a->Fingerprint(), moved->Fingerprint());
  EXPECT_NE(a->Fingerprint(), ClusterSpec().Fingerprint());
}

TEST(Fnv1a64Test, MatchesPublishedVectors) {
  // Reference values of the FNV-1a 64-bit test suite (Fowler/Noll/Vo).
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(TfConfigTest, ChiefBecomesWorkerZero) {
  const char* json = R"({"cluster": {"chief": ["c:1"], "worker": ["w:2", "w:3"], "ps": ["p:4", "p:5"]},
                         "task": {"type": "worker", "index": 1}})";
  auto r = ClusterSpec::FromTfConfig(json);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->first.workers(), ElementsAre("c:1", "w:2", "w:3"));
  EXPECT_THAT(r->first.ps(), ElementsAre("p:4", "p:5"));
  EXPECT_EQ(r->second, (TaskSpec{"worker", 2}));
  EXPECT_EQ(r->first.address(r->second), "w:3");

  auto chief = ClusterSpec::FromTfConfig(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:2"], "ps": ["p:4"]}, "task": {"type": "chief", "index": 0}})");
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_EQ(chief->second, (TaskSpec{"worker", 0}));

  auto ps = ClusterSpec::FromTfConfig(
      R"({"cluster": {"chief": ["c:1"], "ps": ["p:4", "p:5"]}, "task": {"type": "ps", "index": 1}})");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->second, (TaskSpec{"ps", 1}));
  EXPECT_THAT(ps->first.workers(), ElementsAre("c:1"));
}

TEST(TfConfigTest, WithoutChiefWorkersKeepTheirIndex) {
  auto r = ClusterSpec::FromTfConfig(
      R"({"cluster": {"worker": ["w:2", "w:3"], "ps": ["p:4"], "evaluator": ["e:9"]},
          "task": {"type": "worker", "index": 1}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->first.workers(), ElementsAre("w:2", "w:3"));
  EXPECT_EQ(r->second, (TaskSpec{"worker", 1}));
  // Same description as the equivalent flags.
  auto flags = ClusterSpec::FromHostLists("p:4", "w:2,w:3");
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(r->first.Fingerprint(), flags->Fingerprint());
}

// TF's Evaluator replica (Kubeflow TFJob): a task of its own that evaluates the chief's checkpoints;
// it joins no cluster, so the cluster it is given does not matter (even one without ps tasks).
TEST(TfConfigTest, EvaluatorTaskIsAccepted) {
  for (const char* json : {R"({"cluster": {"chief": ["c:1"], "worker": ["w:2"], "ps": ["p:4"], "evaluator": ["e:9"]},
            "task": {"type": "evaluator", "index": 0}})",
                           R"({"cluster": {"evaluator": ["e:9"]}, "task": {"type": "evaluator", "index": 0}})"}) {
    auto r = ClusterSpec::FromTfConfig(json);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->second, (TaskSpec{"evaluator", 0}));
    EXPECT_EQ(r->first.num_workers(), 0);
    EXPECT_EQ(r->first.num_ps(), 0);
  }
  auto resolved = ResolveCluster(
      "", "", "", 0, R"({"cluster": {"worker": ["w:2"], "ps": ["p:4"]}, "task": {"type": "evaluator", "index": 0}})");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->second.job, "evaluator");
}

TEST(ResolveClusterTest, EvaluatorByFlagWithOrWithoutCluster) {
  auto alone = ResolveCluster("", "", "evaluator", 0, "");
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->second, (TaskSpec{"evaluator", 0}));
  auto with_cluster = ResolveCluster("p:1", "w:2", "evaluator", 0, "");
  ASSERT_TRUE(with_cluster.ok()) << with_cluster.status();
  EXPECT_EQ(with_cluster->second, (TaskSpec{"evaluator", 0}));
  auto second = ResolveCluster("", "", "evaluator", 1, "");
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("one evaluator"));
}

struct BadTfConfigCase {
  std::string json;
  std::vector<std::string> must_mention;
};

TEST(TfConfigTest, RejectsBadConfigs) {
  const std::vector<BadTfConfigCase> cases = {
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": )", {"not valid JSON"}},
      {R"([1, 2])", {"not a JSON object"}},
      {R"({"task": {"type": "worker", "index": 0}})", {"no \"cluster\""}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}})", {"no \"task\""}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"index": 0}})", {"no \"type\""}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "worker"}})", {"\"index\""}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "worker", "index": "0"}})", {"\"index\""}},
      {R"({"cluster": {"worker": ["w:1", "w:2"], "ps": ["p:2"]}, "task": {"type": "worker", "index": 2}})",
       {"index 2 is out of range", "cluster.worker lists 2 workers (indices 0..1)"}},
      {R"({"cluster": {"chief": ["c:0"], "worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "worker", "index": 1}})",
       {"index 1 is out of range", "cluster.worker lists 1 worker (index 0)"}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "ps", "index": -1}})",
       {"index -1 is out of range"}},
      {R"({"cluster": {"chief": ["c:0"], "ps": ["p:2"]}, "task": {"type": "chief", "index": 1}})",
       {"chief index 1 is out of range"}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "chief", "index": 0}})",
       {"cluster.chief is missing"}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "evaluator", "index": 1}})",
       {"evaluator index 1 is out of range", "one evaluator"}},
      {R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "master", "index": 0}})",
       {"\"master\" is unsupported", "evaluator"}},
      {R"({"cluster": {"master": ["m:1"], "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})",
       {"\"master\" is unsupported"}},
      {R"({"cluster": {"chief": ["c:0", "c:1"], "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})",
       {"cluster.chief lists 2", "at most one chief"}},
      {R"({"cluster": {"worker": "w:1", "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})",
       {"cluster.worker is not a list"}},
      {R"({"cluster": {"worker": [7], "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})",
       {"cluster.worker[0] is not a string"}},
      {R"({"cluster": {"worker": ["w"], "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})",
       {"TF_CONFIG cluster.worker[0] \"w\"", "no port"}},
      {R"({"cluster": {"chief": ["p:2"], "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})",
       {"p:2 appears twice", "cluster.ps[0]", "cluster.chief[0]"}},
      {R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 0}})", {"no ps"}},
  };
  for (const BadTfConfigCase& c : cases) {
    auto r = ClusterSpec::FromTfConfig(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    ExpectOneLineError(r.status());
    for (const std::string& word : c.must_mention) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(word)) << c.json;
    }
  }
}

TEST(ResolveClusterTest, FromFlags) {
  auto r = ResolveCluster("p:1", "w:2,w:3", "worker", 1, "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->second, (TaskSpec{"worker", 1}));
  EXPECT_EQ(r->first.num_workers(), 2);

  auto out_of_range = ResolveCluster("p:1", "w:2,w:3", "worker", 3, "");
  EXPECT_EQ(out_of_range.status().message(),
            "--task_index=3 is out of range: --worker_hosts lists 2 workers (indices 0..1)");
  auto no_job = ResolveCluster("p:1", "w:2", "", 0, "");
  EXPECT_THAT(std::string(no_job.status().message()), HasSubstr("--job_name is missing"));
}

TEST(ResolveClusterTest, FromTfConfigWhenFlagsAreEmpty) {
  const char* json = R"({"cluster": {"chief": ["c:1"], "worker": ["w:2"], "ps": ["p:3"]},
                         "task": {"type": "worker", "index": 0}})";
  auto r = ResolveCluster("", "", "", 0, json);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->second, (TaskSpec{"worker", 1}));
  // Flags that agree with TF_CONFIG are fine; flags that disagree are an error.
  EXPECT_TRUE(ResolveCluster("", "", "worker", 1, json).ok());
  auto conflict = ResolveCluster("", "", "ps", 0, json);
  ASSERT_FALSE(conflict.ok());
  EXPECT_THAT(std::string(conflict.status().message()), HasSubstr("TF_CONFIG"));
}

TEST(ResolveClusterTest, BothSourcesIsAnError) {
  auto r = ResolveCluster("p:1", "w:2", "worker", 0,
                          R"({"cluster": {"worker": ["w:2"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}})");
  ASSERT_FALSE(r.ok());
  ExpectOneLineError(r.status());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--ps_hosts/--worker_hosts"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("TF_CONFIG"));
}

TEST(ResolveClusterTest, NoClusterIsSingleProcess) {
  auto r = ResolveCluster("", "", "", 0, "");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->first.empty());
  EXPECT_EQ(r->second, (TaskSpec{"worker", 0}));
  EXPECT_TRUE(ResolveCluster("", "", "worker", 0, "").ok());
  EXPECT_FALSE(ResolveCluster("", "", "ps", 0, "").ok());
  EXPECT_FALSE(ResolveCluster("", "", "worker", 2, "").ok());
}

TEST(IsLoopbackHostTest, RecognisesLoopbackForms) {
  for (const char* host : {"127.0.0.1:2222", "127.1.2.3:1", "localhost:80", "LocalHost:80", "[::1]:2222", "::1",
                           "127.0.0.1", "localhost", "[::ffff:127.0.0.1]:5", "[0:0:0:0:0:0:0:1]:7"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0:2222", "10.0.0.1:2222", "128.0.0.1:1", "[::]:2222", "example.com:1",
                           "localhost.example.com:1", "127.0.0.1.example.com:1", "[::2]:3", "", "[::1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

}  // namespace
}  // namespace psflow::dist
