// Bad input to real `psflow train` processes on loopback: TLS and the cluster secret end to end
// (certificates made here with the openssl command), mismatched TLS and secrets, a message over
// --max_message_mb, a port already in use, and malformed cluster flags. Each must end the task
// that cannot go on with a non-zero exit and one line saying what is wrong and how to fix it,
// within a bounded time, while the tasks that can go on keep serving.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

constexpr char kOpenssl[] = "/usr/bin/openssl";

// A task that cannot reach its ps gives up after --ps_timeout_secs=5: this bounds the whole wait.
constexpr double kBadWorkerBoundSecs = 60;

std::string Address(int port) { return absl::StrCat("127.0.0.1:", port); }

// The last line of a process's output (its error line when it failed).
std::string LastLine(const std::string& output) {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
}

int CountOccurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs openssl; false (with a test failure naming the step) when it fails.
bool Openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kOpenssl};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessResult r = RunProcess(argv, 60);
  EXPECT_EQ(r.exit_code, 0) << "openssl " << args[0] << ": " << r.output;
  return r.exit_code == 0;
}

// A CA and a task certificate it signed (SAN IP:127.0.0.1 and DNS:localhost, as the cluster's
// tasks dial them), another CA, and a "rogue" task certificate signed by that other CA.
struct Certificates {
  std::string dir;
  std::string ca, task_cert, task_key, other_ca, rogue_cert, rogue_key;
};

bool MakeCa(const std::string& key, const std::string& cert, const std::string& name) {
  return Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                  "-out", cert, "-days", "2", "-subj", "/CN=" + name});
}

bool MakeSigned(const std::string& dir, const std::string& ca_cert, const std::string& ca_key, const std::string& key,
                const std::string& cert) {
  const std::string csr = cert + ".csr", ext = dir + "/san.cnf";
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  return Openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out",
                  csr, "-subj", "/CN=psflow task"}) &&
         Openssl({"x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                  "-days", "2", "-extfile", ext});
}

std::optional<Certificates> MakeCertificates(const std::string& name) {
  Certificates c;
  c.dir = TempDir(name);
  c.ca = c.dir + "/ca.pem";
  c.task_cert = c.dir + "/task.pem";
  c.task_key = c.dir + "/task.key";
  c.other_ca = c.dir + "/other_ca.pem";
  c.rogue_cert = c.dir + "/rogue.pem";
  c.rogue_key = c.dir + "/rogue.key";
  const std::string ca_key = c.dir + "/ca.key", other_key = c.dir + "/other_ca.key";
  if (!MakeCa(ca_key, c.ca, "psflow test CA") || !MakeCa(other_key, c.other_ca, "some other CA") ||
      !MakeSigned(c.dir, c.ca, ca_key, c.task_key, c.task_cert) ||
      !MakeSigned(c.dir, c.other_ca, other_key, c.rogue_key, c.rogue_cert)) {
    return std::nullopt;
  }
  return c;
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// True once something accepts TCP connections on 127.0.0.1:port (the ps is up), within `secs`.
bool WaitForListening(int port, double secs) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
  while (std::chrono::steady_clock::now() < give_up) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (connected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(BadInputTest, TlsClusterTrainsAndRefusesWorkersWithTheWrongTlsOrSecret) {
  if (!std::filesystem::exists(kOpenssl)) GTEST_SKIP() << "no " << kOpenssl << " to make certificates with";
  const std::optional<Certificates> certs = MakeCertificates("tls_cluster");
  ASSERT_TRUE(certs.has_value());
  const std::string secret = WriteFile(certs->dir + "/secret", "0123456789abcdef0123456789abcdef\n");
  const std::string wrong_secret = WriteFile(certs->dir + "/wrong_secret", "not-the-cluster-secret\n");
  const std::vector<int> ports = FreePorts(3);
  const std::vector<std::string> cluster = {"--ps_hosts=" + Address(ports[0]),
                                            "--worker_hosts=" + Address(ports[1]) + "," + Address(ports[2]),
                                            "--model=mlp",
                                            "--train_steps=200",
                                            "--data_dir=" + MnistDir(),
                                            "--ps_timeout_secs=5"};
  auto task = [&](const std::string& job, int index, const std::vector<std::string>& security) {
    std::vector<std::string> args = {"train", "--job_name=" + job, "--task_index=" + std::to_string(index)};
    args.insert(args.end(), cluster.begin(), cluster.end());
    args.insert(args.end(), security.begin(), security.end());
    return Psflow(args);
  };
  const std::vector<std::string> tls = {"--tls_cert=" + certs->task_cert, "--tls_key=" + certs->task_key,
                                        "--tls_ca=" + certs->ca, "--cluster_secret_file=" + secret};

  Process ps(task("ps", 0, tls));
  ASSERT_TRUE(WaitForListening(ports[0], 30));

  // Workers that must not get in, all at once (each waits up to --ps_timeout_secs): each exits
  // non-zero with a last line naming what to fix.
  struct BadWorker {
    std::string name;
    std::vector<std::string> security;
    std::string expected;
  };
  const std::vector<BadWorker> bad = {
      {"no TLS flags",
       {"--cluster_secret_file=" + secret},
       "it uses TLS and this task must be started with the same --tls_cert/--tls_key/--tls_ca"},
      {"another CA",
       {"--tls_cert=" + certs->task_cert, "--tls_key=" + certs->task_key, "--tls_ca=" + certs->other_ca,
        "--cluster_secret_file=" + secret},
       "certificate verify failed (the task's certificate is not signed by the CA in this task's --tls_ca"},
      {"a certificate of another CA",
       {"--tls_cert=" + certs->rogue_cert, "--tls_key=" + certs->rogue_key, "--tls_ca=" + certs->ca,
        "--cluster_secret_file=" + secret},
       "it may not trust this task's certificate"},
      {"no client certificate",
       {"--tls_ca=" + certs->ca, "--cluster_secret_file=" + secret},
       "give this task --tls_cert and --tls_key"},
      {"the wrong secret",
       {"--tls_cert=" + certs->task_cert, "--tls_key=" + certs->task_key, "--tls_ca=" + certs->ca,
        "--cluster_secret_file=" + wrong_secret},
       "refused Hello: wrong cluster secret (start every task with the same --cluster_secret_file)"},
      {"no secret",
       {"--tls_cert=" + certs->task_cert, "--tls_key=" + certs->task_key, "--tls_ca=" + certs->ca},
       "refused Hello: no cluster secret"},
  };
  std::vector<std::unique_ptr<Process>> attempts;
  for (const BadWorker& b : bad) attempts.push_back(std::make_unique<Process>(task("worker", 1, b.security)));
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(bad[i].name);
    ProcessResult r = attempts[i]->Wait(kBadWorkerBoundSecs);
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string last = LastLine(r.output);
    EXPECT_EQ(last.rfind("psflow: error: ", 0), 0u) << r.output;
    EXPECT_NE(last.find(bad[i].expected), std::string::npos) << r.output;
    EXPECT_NE(last.find("ps task 0 (" + Address(ports[0]) + ")"), std::string::npos) << r.output;
  }

  // The ps still serves the cluster's own workers, which train to the end.
  const std::string metrics = certs->dir + "/m.json";
  std::vector<std::string> chief_flags = tls;
  chief_flags.push_back("--metrics_json=" + metrics);
  Process chief(task("worker", 0, chief_flags));
  Process worker(task("worker", 1, tls));
  ProcessResult c = chief.Wait(120), w = worker.Wait(60), p = ps.Wait(60);
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_GE(ReadJson(metrics)["global_step"].get<int64_t>(), 200);
  EXPECT_NE(p.output.find("done at global step 200"), std::string::npos) << p.output;
  // gRPC logs a refused handshake at every reconnection attempt; the ps shows each kind once.
  EXPECT_EQ(CountOccurrences(p.output, "wrong version number"), 1) << p.output;
}

TEST(BadInputTest, TlsWorkerAgainstAPlainTextPsSaysTheOtherSideHasNoTls) {
  if (!std::filesystem::exists(kOpenssl)) GTEST_SKIP() << "no " << kOpenssl << " to make certificates with";
  const std::optional<Certificates> certs = MakeCertificates("tls_to_plain");
  ASSERT_TRUE(certs.has_value());
  const std::vector<int> ports = FreePorts(2);
  const std::vector<std::string> cluster = {"--ps_hosts=" + Address(ports[0]), "--worker_hosts=" + Address(ports[1]),
                                            "--model=mlp", "--data_dir=" + MnistDir(), "--ps_timeout_secs=5"};
  std::vector<std::string> ps_args = {"train", "--job_name=ps", "--init_timeout_secs=60"};
  ps_args.insert(ps_args.end(), cluster.begin(), cluster.end());
  Process ps(Psflow(ps_args));
  ASSERT_TRUE(WaitForListening(ports[0], 30));
  std::vector<std::string> worker_args = {"train", "--job_name=worker", "--tls_cert=" + certs->task_cert,
                                          "--tls_key=" + certs->task_key, "--tls_ca=" + certs->ca};
  worker_args.insert(worker_args.end(), cluster.begin(), cluster.end());
  ProcessResult r = RunProcess(Psflow(worker_args), kBadWorkerBoundSecs);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(LastLine(r.output).find("this task speaks TLS but the other does not: give every task the same "
                                    "--tls_cert/--tls_key/--tls_ca"),
            std::string::npos)
      << r.output;
}

TEST(BadInputTest, MessageOverMaxMessageMbEndsTheJobNamingTheLimitAndTheFlag) {
  // The cnn's initial values (12.5 MiB; a fresh job sends no optimizer slots, each ps makes them)
  // do not fit the ps's 1 MiB limit.
  const std::vector<int> ports = FreePorts(2);
  const std::vector<std::string> cluster = {"--ps_hosts=" + Address(ports[0]),
                                            "--worker_hosts=" + Address(ports[1]),
                                            "--model=cnn",
                                            "--train_steps=5",
                                            "--batch_size=8",
                                            "--data_dir=" + MnistDir()};
  std::vector<std::string> ps_args = {"train", "--job_name=ps", "--max_message_mb=1"};
  ps_args.insert(ps_args.end(), cluster.begin(), cluster.end());
  std::vector<std::string> chief_args = {"train", "--job_name=worker", "--ps_timeout_secs=30"};
  chief_args.insert(chief_args.end(), cluster.begin(), cluster.end());
  Process ps(Psflow(ps_args));
  ProcessResult c = RunProcess(Psflow(chief_args), 120);
  ProcessResult p = ps.Wait(60);
  const std::string expected = absl::StrCat("ps task 0 (", Address(ports[0]),
                                            "): Initialize refused: a message of 12.5 MiB is over the 1 MiB limit");
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_NE(LastLine(c.output).find(expected), std::string::npos) << c.output;
  EXPECT_NE(LastLine(c.output).find("start every task with a larger --max_message_mb"), std::string::npos) << c.output;
  // The chief aborts the job: the ps ends too, with the chief's reason.
  EXPECT_FALSE(p.timed_out) << p.output;
  EXPECT_EQ(p.exit_code, 1) << p.output;
  EXPECT_NE(LastLine(p.output).find(expected), std::string::npos) << p.output;
}

TEST(BadInputTest, AChiefThatNeverReachedAPsFailsWithinPsTimeoutAndShutsNothingDown) {
  // Nothing listens on the ps address. The chief waits --ps_timeout_secs for it, then fails; it
  // must not spend a second bound retrying a Shutdown of a task it never reached.
  const std::vector<int> ports = FreePorts(2);
  const double ps_timeout = 8;
  const auto start = std::chrono::steady_clock::now();
  ProcessResult r = RunProcess(Psflow({"train", "--job_name=worker", "--task_index=0",
                                       "--ps_hosts=" + Address(ports[0]), "--worker_hosts=" + Address(ports[1]),
                                       "--ps_timeout_secs=8", "--train_steps=10", "--data_dir=" + MnistDir()}),
                               kBadWorkerBoundSecs);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(LastLine(r.output), ::testing::HasSubstr("could not reach ps task 0")) << r.output;
  EXPECT_EQ(r.output.find("Shutdown"), std::string::npos) << r.output;
  // One bound, not two (the bug took 2 x --ps_timeout_secs): a behaviour, with seconds of slack
  // for start-up on a loaded machine.
  EXPECT_LT(secs, 1.5 * ps_timeout + 4) << r.output;
}

TEST(BadInputTest, PortInUseIsOneLineNamingTheAddress) {
  const std::vector<int> ports = FreePorts(2);
  const std::string worker = "--worker_hosts=" + Address(ports[1]);
  // A port some other program listens on.
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(ports[0]));
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    ProcessResult r = RunProcess(Psflow({"train", "--job_name=ps", "--ps_hosts=" + Address(ports[0]), worker}), 30);
    close(fd);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(CountLines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find("cannot listen on " + Address(ports[0]) + ": the port is in use by another process"),
              std::string::npos)
        << r.output;
  }
  // Two ps tasks on one port (gRPC would share it through SO_REUSEPORT; psflow turns that off).
  Process first(
      Psflow({"train", "--job_name=ps", "--init_timeout_secs=60", "--ps_hosts=" + Address(ports[0]), worker}));
  ASSERT_TRUE(WaitForListening(ports[0], 30));
  ProcessResult second = RunProcess(Psflow({"train", "--job_name=ps", "--ps_hosts=" + Address(ports[0]), worker}), 30);
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_EQ(CountLines(second.output), 1) << second.output;
  EXPECT_NE(second.output.find("cannot listen on " + Address(ports[0]) + ": the port is in use"), std::string::npos)
      << second.output;
  EXPECT_TRUE(WaitForListening(ports[0], 5));  // the first still serves
}

TEST(BadInputTest, MalformedClusterAndSecurityFlagsAreOneLineErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string tf_config;  // "" = unset
    std::string expected;
    int exit_code = 2;  // the command line or TF_CONFIG is wrong; 1: the task started and failed
  };
  const std::string w = "--worker_hosts=127.0.0.1:2";
  const std::string tf_cluster = R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, )";
  const std::vector<Case> cases = {
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:99999", w},
       "",
       "\"127.0.0.1:99999\" has port \"99999\": the port must be a number in 1..65535"},
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:", w}, "", "\"127.0.0.1:\" has an empty port"},
      {{"--job_name=ps", "--ps_hosts=:5000", w}, "", "\":5000\" has an empty host"},
      {{"--job_name=worker", "--ps_hosts=127.0.0.1:3", "--worker_hosts="}, "", "--worker_hosts"},
      {{"--job_name=worker", "--ps_hosts=127.0.0.1:3", "--worker_hosts=", "--model=mlp"},
       "",
       "is a flag, not host:port"},
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:3", "--worker_hosts", ""},
       "",
       "--worker_hosts is empty: a ps task serves workers"},
      {{"--job_name=worker", "--ps_hosts=127.0.0.1:3", "--worker_hosts=127.0.0.1:2,127.0.0.1:3"},
       "",
       "address 127.0.0.1:3 appears twice (--ps_hosts entry 0 and --worker_hosts entry 1)"},
      {{},
       tf_cluster + R"("task": {"type": "worker", "index": 2}})",
       "TF_CONFIG task worker index 2 is out of range: cluster.worker lists 2 workers (indices 0..1)"},
      {{}, tf_cluster + R"("task": {"type": "ps", "index": 1}})", "TF_CONFIG task ps index 1 is out of range"},
      {{}, R"({"cluster": {"worker": ["127.0.0.1:1"], )", "TF_CONFIG is not valid JSON"},
      {{"--ps_hosts=127.0.0.1:3", w},
       tf_cluster + R"("task": {"type": "ps", "index": 0}})",
       "the cluster is given twice"},
      {{"--job_name=ps", "--ps_hosts=10.1.2.3:2222", w},
       "",
       "refusing to listen on non-loopback address 10.1.2.3:2222 without authentication",
       1},
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:3", w, "--cluster_secret_file=/nonexistent/secret"},
       "",
       "--cluster_secret_file=/nonexistent/secret cannot be read",
       1},
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:3", w, "--tls_cert=/nonexistent/task.pem",
        "--tls_key=/nonexistent/task.key"},
       "",
       "cannot read the TLS cert file '/nonexistent/task.pem'",
       1},
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:3", w, "--max_message_mb=0"},
       "",
       "--max_message_mb=0 must be between 1 and 2047"},
      {{"--job_name=ps", "--ps_hosts=127.0.0.1:3", w, "--max_message_mb=4096"},
       "",
       "--max_message_mb=4096 must be between"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    std::vector<std::string> env;
    if (!c.tf_config.empty()) env.push_back("TF_CONFIG=" + c.tf_config);
    ProcessResult r = RunProcess(Psflow(args), 30, env);
    SCOPED_TRACE(c.expected);
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
    EXPECT_EQ(CountLines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace psflow::testing
