// The registry's text format against hand-written expected text, and the server over real HTTP on
// 127.0.0.1 with httplib's client.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "psflow/metrics/metrics_server.h"

namespace psflow::metrics {
namespace {

using ::testing::HasSubstr;
using Type = MetricsRegistry::Type;

TEST(MetricsRegistryTest, RendersThePsflowMetrics) {
  MetricsRegistry registry;
  ASSERT_TRUE(DeclarePsflowMetrics(registry).ok());
  registry.SetGauge(kGlobalStep, {}, 1200);
  registry.SetGauge(kStepsPerSecond, {}, 12.5);
  registry.SetCounter(kPsBytesIn, {{"ps", "0"}}, 1048576);
  registry.SetCounter(kPsBytesIn, {{"ps", "1"}}, 2000);
  registry.AddCounter(kPsBytesOut, {{"ps", "1"}}, 300);
  registry.AddCounter(kPsBytesOut, {{"ps", "1"}}, 200);
  registry.AddCounter(kPushesRefused, {});
  registry.AddCounter(kPushesRefused, {});
  registry.SetGauge(kConnectedWorkers, {}, 3);
  EXPECT_EQ(registry.Render(),
            "# HELP psflow_connected_workers Workers currently connected.\n"
            "# TYPE psflow_connected_workers gauge\n"
            "psflow_connected_workers 3\n"
            "# HELP psflow_global_step Global step of the training job as last seen by this task.\n"
            "# TYPE psflow_global_step gauge\n"
            "psflow_global_step 1200\n"
            "# HELP psflow_ps_bytes_in_total Bytes received by parameter-server task ps.\n"
            "# TYPE psflow_ps_bytes_in_total counter\n"
            "psflow_ps_bytes_in_total{ps=\"0\"} 1048576\n"
            "psflow_ps_bytes_in_total{ps=\"1\"} 2000\n"
            "# HELP psflow_ps_bytes_out_total Bytes sent by parameter-server task ps.\n"
            "# TYPE psflow_ps_bytes_out_total counter\n"
            "psflow_ps_bytes_out_total{ps=\"1\"} 500\n"
            "# HELP psflow_pushes_refused_total Gradient pushes refused by the parameter servers.\n"
            "# TYPE psflow_pushes_refused_total counter\n"
            "psflow_pushes_refused_total 2\n"
            "# HELP psflow_stale_gradients_dropped_total Gradients dropped for being too stale.\n"
            "# TYPE psflow_stale_gradients_dropped_total counter\n"
            "psflow_stale_gradients_dropped_total 0\n"
            "# HELP psflow_steps_per_second Global steps per second over the last measurement interval.\n"
            "# TYPE psflow_steps_per_second gauge\n"
            "psflow_steps_per_second 12.5\n");
}

TEST(MetricsRegistryTest, EscapesLabelValuesAndHelpAndFormatsSpecialValues) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.Declare("odd", Type::kGauge, "a \\ back\nslash \"quoted\"", {"path", "le"}).ok());
  registry.SetGauge("odd", {{"path", "C:\\dir\n\"x\""}, {"le", "1"}}, 0.1);
  registry.SetGauge("odd", {{"path", "a"}, {"le", "2"}}, std::numeric_limits<double>::infinity());
  registry.SetGauge("odd", {{"path", "b"}, {"le", "3"}}, -std::numeric_limits<double>::infinity());
  registry.SetGauge("odd", {{"path", "c"}, {"le", "4"}}, std::numeric_limits<double>::quiet_NaN());
  registry.SetGauge("odd", {{"path", "d"}, {"le", "5"}}, 1e21);
  registry.SetGauge("odd", {{"path", "e"}, {"le", "6"}}, -3);
  EXPECT_EQ(registry.Render(),
            "# HELP odd a \\\\ back\\nslash \"quoted\"\n"
            "# TYPE odd gauge\n"
            "odd{path=\"C:\\\\dir\\n\\\"x\\\"\",le=\"1\"} 0.1\n"
            "odd{path=\"a\",le=\"2\"} +Inf\n"
            "odd{path=\"b\",le=\"3\"} -Inf\n"
            "odd{path=\"c\",le=\"4\"} NaN\n"
            "odd{path=\"d\",le=\"5\"} 1e+21\n"
            "odd{path=\"e\",le=\"6\"} -3\n");
}

TEST(MetricsRegistryTest, LabeledFamiliesAppearOnceSet) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.Declare("x_total", Type::kCounter, "x", {"ps"}).ok());
  EXPECT_EQ(registry.Render(), "");
  registry.AddCounter("x_total", {{"ps", "0"}}, 0.5);
  EXPECT_EQ(registry.Render(), "# HELP x_total x\n# TYPE x_total counter\nx_total{ps=\"0\"} 0.5\n");
}

TEST(MetricsRegistryTest, DeclareValidatesNamesAndConflicts) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.Declare("", Type::kGauge, "h").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Declare("1abc", Type::kGauge, "h").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Declare("a-b", Type::kGauge, "h").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Declare("ok", Type::kGauge, "h", {"__reserved"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Declare("ok", Type::kGauge, "h", {"a:b"}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry.Declare("ns:ok_1", Type::kGauge, "h", {"ps"}).ok());
  EXPECT_TRUE(registry.Declare("ns:ok_1", Type::kGauge, "h", {"ps"}).ok());
  const absl::Status conflict = registry.Declare("ns:ok_1", Type::kCounter, "h", {"ps"});
  EXPECT_EQ(conflict.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(conflict.message(), HasSubstr("ns:ok_1"));
}

TEST(MetricsRegistryDeathTest, MisuseIsAProgrammerError) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.Declare("g", Type::kGauge, "h", {"ps"}).ok());
  EXPECT_DEATH(registry.SetGauge("missing", {}, 1), "metric missing was not declared");
  EXPECT_DEATH(registry.AddCounter("g", {{"ps", "0"}}), "metric g is a gauge");
  EXPECT_DEATH(registry.SetGauge("g", {{"task", "0"}}, 1), "takes labels \\{ps\\}");
  EXPECT_DEATH(registry.SetGauge("g", {}, 1), "takes labels \\{ps\\}");
}

TEST(MetricsRegistryTest, CallbacksRunOnEveryScrapeUntilUnregistered) {
  MetricsRegistry registry;
  ASSERT_TRUE(DeclarePsflowMetrics(registry).ok());
  int scrapes = 0;
  const int id = registry.RegisterCallback([&](MetricsRegistry::Snapshot& snapshot) {
    ++scrapes;
    snapshot.Set(kPsBytesIn, {{"ps", "2"}}, 100.0 * scrapes);  // a counter kept elsewhere
    snapshot.Set(kConnectedWorkers, {}, scrapes);
  });
  EXPECT_THAT(registry.Render(), HasSubstr("psflow_ps_bytes_in_total{ps=\"2\"} 100\n"));
  const std::string second = registry.Render();
  EXPECT_THAT(second, HasSubstr("psflow_ps_bytes_in_total{ps=\"2\"} 200\n"));
  EXPECT_THAT(second, HasSubstr("psflow_connected_workers 2\n"));
  registry.UnregisterCallback(id);
  EXPECT_THAT(registry.Render(), HasSubstr("psflow_connected_workers 2\n"));  // last value stays
  EXPECT_EQ(scrapes, 2);
}

TEST(MetricsRegistryTest, ConcurrentCountersLoseNothing) {
  MetricsRegistry registry;
  ASSERT_TRUE(DeclarePsflowMetrics(registry).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry, t] {
      for (int i = 0; i < 1000; ++i) {
        registry.AddCounter(kPushesRefused, {});
        registry.AddCounter(kPsBytesOut, {{"ps", std::to_string(t % 2)}}, 2);
        if (i % 100 == 0) registry.Render();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("psflow_pushes_refused_total 4000\n"));
  EXPECT_THAT(text, HasSubstr("psflow_ps_bytes_out_total{ps=\"0\"} 4000\n"));
  EXPECT_THAT(text, HasSubstr("psflow_ps_bytes_out_total{ps=\"1\"} 4000\n"));
}

TEST(MetricsServerTest, ServesTheRegistryOverHttp) {
  MetricsRegistry registry;
  ASSERT_TRUE(DeclarePsflowMetrics(registry).ok());
  registry.SetGauge(kGlobalStep, {}, 42);
  registry.SetCounter(kPsBytesIn, {{"ps", "0"}}, 7);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(&registry, 0);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->host(), "127.0.0.1");
  ASSERT_GT((*server)->port(), 0);

  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(response->body, HasSubstr("# TYPE psflow_global_step gauge\npsflow_global_step 42\n"));
  EXPECT_THAT(response->body, HasSubstr("psflow_ps_bytes_in_total{ps=\"0\"} 7\n"));
  EXPECT_EQ(response->body, registry.Render());

  registry.SetGauge(kGlobalStep, {}, 43);  // each scrape sees the current values
  response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_THAT(response->body, HasSubstr("psflow_global_step 43\n"));

  response = client.Get("/other");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 404);

  const int port = (*server)->port();
  (*server)->Stop();
  (*server)->Stop();  // idempotent
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(2);
  EXPECT_FALSE(after.Get("/metrics"));
}

TEST(MetricsServerTest, ATakenPortIsAnErrorNamingIt) {
  MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<MetricsServer>> first = MetricsServer::Start(&registry, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  // Another psflow task asking for the same --metrics_port.
  absl::StatusOr<std::unique_ptr<MetricsServer>> second = MetricsServer::Start(&registry, "127.0.0.1", port);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics_port"));

  // Any other program listening there.
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(sock, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(sock, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int taken = ntohs(address.sin_port);
  absl::StatusOr<std::unique_ptr<MetricsServer>> third = MetricsServer::Start(&registry, taken);
  close(sock);
  ASSERT_FALSE(third.ok());
  EXPECT_THAT(third.status().message(), HasSubstr("127.0.0.1:" + std::to_string(taken)));
}

TEST(MetricsServerTest, RejectsPortsOutOfRange) {
  MetricsRegistry registry;
  EXPECT_EQ(MetricsServer::Start(&registry, 70000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start(&registry, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace psflow::metrics
