// psflow::cli::ParseFlags (psflow/cli/flags.h) and the flag table under it (train/flags.h): the
// layers and their order, the program's own arguments passed through, the house line for a value
// of the wrong type, TF_CONFIG's role, and every flag surviving a round trip through its text.
#include "psflow/cli/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "train/flags.h"

namespace psflow::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Clears PSFLOW_FLAGS and TF_CONFIG for a test, and restores what was there.
class FlagsEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"PSFLOW_FLAGS", "TF_CONFIG"}) {
      if (const char* v = std::getenv(name)) saved_.emplace_back(name, v);
      unsetenv(name);
    }
  }
  void TearDown() override {
    unsetenv("PSFLOW_FLAGS");
    unsetenv("TF_CONFIG");
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

using ParseFlagsTest = FlagsEnv;

TEST_F(ParseFlagsTest, NothingGivenIsPsflowTrainsDefaultsResolvedForTheModel) {
  auto f = ParseFlags({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.model, "mlp");
  EXPECT_EQ(f->options.train_steps, 10000);  // mlp's own, filled by the resolution
  EXPECT_EQ(f->options.optimizer, "adam");
  EXPECT_EQ(f->options.transport, "grpc");
  EXPECT_FALSE(f->options.sync_replicas);
  EXPECT_TRUE(f->unparsed.empty());
}

TEST_F(ParseFlagsTest, LayersDefaultsThenEnvironmentThenCommandLine) {
  setenv("PSFLOW_FLAGS", R"(["--train_steps=500", "--sync_replicas", "--batch_size=20"])", 1);
  auto f =
      ParseFlags({"--batch_size=30", "--my_flag=1", "--other", "x", "--lr_staircase=false"},
                 {"--batch_size=10", "--optimizer=sgd", "--learning_rate=0.5", "--train_steps=7", "--lr_staircase"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.train_steps, 500);  // PSFLOW_FLAGS over the program's default
  EXPECT_EQ(f->options.batch_size, 30);    // the command line over both
  EXPECT_EQ(f->options.optimizer, "sgd");  // only the program's default gave it
  EXPECT_FLOAT_EQ(*f->options.learning_rate, 0.5f);
  EXPECT_TRUE(f->options.sync_replicas);  // a bare flag is true
  EXPECT_FALSE(f->options.lr_staircase);  // --flag=false over a bare default
  EXPECT_THAT(f->unparsed, ElementsAre("--my_flag=1", "--other", "x"));
}

TEST_F(ParseFlagsTest, AFlagGivenTwiceTakesTheLastValue) {
  auto f = ParseFlags({"--train_steps=5", "--train_steps=9"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.train_steps, 9);
}

TEST_F(ParseFlagsTest, MainsArgumentsSkipTheProgram) {
  const char* argv[] = {"./my_program", "--batch_size=7", "--epochs=3"};
  auto f = ParseFlags(3, argv);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.batch_size, 7);
  EXPECT_THAT(f->unparsed, ElementsAre("--epochs=3"));
}

TEST_F(ParseFlagsTest, AValueOfTheWrongTypeIsTheHouseLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--train_steps=abc", "--train_steps=abc must be an integer"},
      {"--batch_size=1.5", "--batch_size=1.5 must be an integer"},
      {"--batch_size=3000000000", "--batch_size=3000000000 must be an integer from -2147483648 to 2147483647"},
      {"--seed=-1", "--seed=-1 must be a non-negative integer"},
      {"--learning_rate=fast", "--learning_rate=fast must be a number"},
      {"--rpc_timeout_secs=10s", "--rpc_timeout_secs=10s must be a number"},
      {"--sync_replicas=maybe", "--sync_replicas=maybe must be true or false"},
  };
  for (const auto& [arg, expected] : cases) {
    auto f = ParseFlags({arg});
    ASSERT_FALSE(f.ok()) << arg;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << arg;
    EXPECT_EQ(f.status().message(), expected);
  }
}

TEST_F(ParseFlagsTest, ALayerThatIsNotTheCommandLineIsNamedInItsErrors) {
  setenv("PSFLOW_FLAGS", "--train_steps=5", 1);
  EXPECT_THAT(std::string(ParseFlags({}).status().message()),
              HasSubstr("PSFLOW_FLAGS must be a JSON array of strings"));
  setenv("PSFLOW_FLAGS", R"(["--no_such_flag=1"])", 1);
  EXPECT_EQ(ParseFlags({}).status().message(),
            "PSFLOW_FLAGS: '--no_such_flag=1' is not a psflow train flag (see psflow train --help)");
  setenv("PSFLOW_FLAGS", R"(["--log_every=often"])", 1);
  EXPECT_EQ(ParseFlags({}).status().message(), "PSFLOW_FLAGS: --log_every=often must be an integer");
  unsetenv("PSFLOW_FLAGS");
  EXPECT_EQ(ParseFlags({}, {"--epochs=3"}).status().message(),
            "defaults: '--epochs=3' is not a psflow train flag (see psflow train --help)");
}

TEST_F(ParseFlagsTest, ValuesAreValidatedAsPsflowTrainDoes) {
  EXPECT_EQ(ParseFlags({"--batch_size=0"}).status().message(),
            "--batch_size=0 must be positive; leave it out for the model's default (100)");
  EXPECT_EQ(ParseFlags({"--transport=udp"}).status().message(), "--transport=udp must be grpc or shm");
}

TEST_F(ParseFlagsTest, TfConfigGivesTheRoleWhenTheFlagsDoNot) {
  setenv("TF_CONFIG",
         R"({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]},
             "task": {"type": "worker", "index": 1}})",
         1);
  auto f = ParseFlags({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.job_name, "worker");
  EXPECT_EQ(f->options.task_index, 1);
  // Cluster flags given: TF_CONFIG is not read.
  f = ParseFlags({"--job_name=ps", "--ps_hosts=127.0.0.1:5", "--worker_hosts=127.0.0.1:6"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.job_name, "ps");
  EXPECT_EQ(f->options.task_index, 0);
}

// Every flag set to a value other than its default (written out here, not from the table) comes
// back the same through its "--name=value" text.
TEST_F(ParseFlagsTest, EveryFlagSurvivesARoundTripThroughItsText) {
  train::TrainOptions o;
  o.job_name = "worker";
  o.task_index = 1;
  o.ps_hosts = "127.0.0.1:1";
  o.worker_hosts = "127.0.0.1:2,127.0.0.1:3";
  o.slurm_jobs = "worker:2,ps:1";
  o.slurm_port_base = 7000;
  o.model = "cnn";
  o.hidden_units = 17;
  o.data_dir = "/d a t a";
  o.train_steps = 123456789012;
  o.batch_size = 3;
  o.optimizer = "momentum";
  o.learning_rate = 0.1f;
  o.lr_decay_steps = 9;
  o.lr_decay_rate = 0.3f;
  o.lr_staircase = true;
  o.sparse_optimizer = "ftrl";
  o.sparse_learning_rate = 0.2f;
  o.ftrl_l1 = 0.5;
  o.ftrl_l2 = 0.25;
  o.ctr_vocab = 1000;
  o.ctr_fields = 3;
  o.ctr_dense = 5;
  o.ctr_dim = 8;
  o.ctr_test_examples = 100;
  o.train_files = "/t/train-*,/u/x.gz";
  o.test_files = "/t/test.gz";
  o.max_bad_lines = 12;
  o.num_epochs = 3;
  o.shuffle_files = true;
  o.file_slices = 4;
  o.file_split = "static";
  o.sparse_sync_mean = "row_count";
  o.table_dir = "/t";
  o.table_cache_bytes = 12345;
  o.table_scan_timeout_secs = 42.5;
  o.sync_replicas = true;
  o.replicas_to_aggregate = 2;
  o.total_num_replicas = 2;
  o.sync_timeout_secs = 0.1;
  o.partitioner = "fixed:2";
  o.placement = "greedy";
  o.log_device_placement = true;
  o.local_replicas = 3;
  o.checkpoint_dir = "/c";
  o.save_checkpoint_steps = 11;
  o.save_checkpoint_secs = 1e-7;
  o.logdir = "/l";
  o.save_summaries_steps = 13;
  o.metrics_json = "/m.json";
  o.metrics_port = 9100;
  o.eval_every_steps = 50;
  o.eval_timeout_secs = 7.5;
  o.seed = 18446744073709551615ull;
  o.intra_op_threads = 4;
  o.log_every = 7;
  o.init_timeout_secs = 1.5;
  o.rpc_timeout_secs = 2.25;
  o.ps_timeout_secs = 1.0 / 3.0;
  o.worker_timeout_secs = 1e300;
  o.max_message_mb = 2047;
  o.transport = "shm";
  o.cluster_secret_file = "/s";
  o.tls_cert = "/cert";
  o.tls_key = "/key";
  o.tls_ca = "/ca";
  o.insecure = true;
  o.sparse_optimizer = "ftrl";
  o.sparse_learning_rate = 0.375f;
  o.table_options = {{"initializer", "zeros"}, {"partition_strategy", "mod"}, {"admit_after", "2"},
                     {"steps_to_live", "9"},   {"max_rows", "1000"},          {"evict_every", "5"},
                     {"storage", "disk"}};
  const std::vector<std::string> args = train::FlagArgs(o);
  EXPECT_EQ(args.size(), train::TrainFlags().size());  // every flag was given a value above
  auto f = ParseFlags(args);
  ASSERT_TRUE(f.ok()) << f.status();
  const train::TrainOptions& p = f->options;
  EXPECT_EQ(p.worker_hosts, o.worker_hosts);
  EXPECT_EQ(p.data_dir, o.data_dir);
  EXPECT_EQ(p.train_steps, o.train_steps);
  EXPECT_EQ(p.learning_rate, o.learning_rate);  // bit-exact, not approximately
  EXPECT_EQ(p.lr_decay_rate, o.lr_decay_rate);
  EXPECT_EQ(p.sync_timeout_secs, o.sync_timeout_secs);
  EXPECT_EQ(p.save_checkpoint_secs, o.save_checkpoint_secs);
  EXPECT_EQ(p.ps_timeout_secs, o.ps_timeout_secs);
  EXPECT_EQ(p.worker_timeout_secs, o.worker_timeout_secs);
  EXPECT_EQ(p.seed, o.seed);
  EXPECT_TRUE(p.lr_staircase && p.sync_replicas && p.log_device_placement && p.insecure);
  EXPECT_EQ(p.tls_ca, o.tls_ca);
  EXPECT_EQ(train::FlagArgs(p), args);  // and every other flag
}

TEST(FlagTableTest, EachRowHasItsOwnNameAndItsOwnMember) {
  std::set<std::string> names;
  std::set<std::pair<size_t, const void*>> members;
  train::TrainOptions o;
  for (const train::Flag& flag : train::TrainFlags()) {
    EXPECT_TRUE(names.insert(std::string(flag.name)).second) << flag.name << " is in the table twice";
    const void* address = std::visit(
        [&](auto m) -> const void* {
          if constexpr (std::is_same_v<decltype(m), train::TableOptionField>) {
            return m.field.data();  // a table option: its own field of dist::TableFields()
          } else {
            return &(o.*m);
          }
        },
        flag.field);
    EXPECT_TRUE(members.emplace(flag.field.index(), address).second) << flag.name << " shares a member";
    EXPECT_EQ(train::FindFlag(flag.name), &flag);
    EXPECT_FALSE(flag.help.empty()) << flag.name;
  }
  EXPECT_EQ(train::FindFlag("no_such_flag"), nullptr);
}

}  // namespace
}  // namespace psflow::cli
