// The metrics endpoint served in-process on loopback and scraped over real TCP, with kj's HTTP
// client and with raw bytes (to see exactly what goes on the wire).

#include "server/metrics/metrics_server.hpp"

#include "server/metrics/prometheus_text.hpp"

#include <gtest/gtest.h>
#include <kj/compat/http.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace gpuproxy::server {
namespace {

struct Scrape {
  unsigned status = 0;
  std::string contentType;
  std::string allow;
  std::string body;
};

class MetricsServerTest : public ::testing::Test {
protected:
  MetricsServerTest()
      : io_(kj::setupAsyncIo()),
        headerTable_(makeHeaderTable(allowHeader_)),
        server_(io_.provider->getNetwork(), io_.provider->getTimer(), "127.0.0.1:0",
                [this](protocol::DaemonStatus::Builder status) {
                  fill(status);
                  return kj::READY_NOW;
                }) {}

  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~MetricsServerTest() noexcept override {}

  void SetUp() override {
    port_ = server_.start(io_.waitScope);
    ASSERT_NE(port_, 0);
    serving_ = server_.listen().eagerlyEvaluate(
        [](kj::Exception&& e) { ADD_FAILURE() << e.getDescription().cStr(); });
  }

  void fill(protocol::DaemonStatus::Builder status) {
    ++scrapes_;
    if (failNext_) {
      failNext_ = false;
      throw std::runtime_error("state is locked");
    }
    status.setBackend("sim");
    status.setVersion("9.9.9");
    status.initClients(static_cast<unsigned>(scrapes_));  // differs per scrape: proves freshness
    auto tenant = status.initTenants(1)[0];
    tenant.setName("team-a");
    tenant.setKernelsLaunched(7);
  }

  static kj::Own<kj::HttpHeaderTable> makeHeaderTable(kj::HttpHeaderId& allow) {
    kj::HttpHeaderTable::Builder builder;
    allow = builder.add("Allow");
    return builder.build();
  }

  Scrape request(kj::HttpMethod method, kj::StringPtr path) {
    auto address = io_.provider->getNetwork().parseAddress("127.0.0.1", port_).wait(io_.waitScope);
    auto client = kj::newHttpClient(io_.provider->getTimer(), *headerTable_, *address);
    kj::HttpHeaders headers(*headerTable_);
    headers.set(kj::HttpHeaderId::HOST, "127.0.0.1");
    auto response = client->request(method, path, headers).response.wait(io_.waitScope);
    Scrape scrape;
    scrape.status = response.statusCode;
    KJ_IF_MAYBE (type, response.headers->get(kj::HttpHeaderId::CONTENT_TYPE)) {
      scrape.contentType = type->cStr();
    }
    KJ_IF_MAYBE (allow, response.headers->get(allowHeader_)) {
      scrape.allow = allow->cStr();
    }
    scrape.body = response.body->readAllText().wait(io_.waitScope).cStr();
    return scrape;
  }

  // Writes `raw` on a fresh connection and returns everything the server sends back.
  std::string rawExchange(kj::StringPtr raw) {
    auto address = io_.provider->getNetwork().parseAddress("127.0.0.1", port_).wait(io_.waitScope);
    auto stream = address->connect().wait(io_.waitScope);
    stream->write(raw.begin(), raw.size()).wait(io_.waitScope);
    // kj's server keeps a connection open for pipelining whatever the client asks; the end of
    // our side is what makes it close after answering.
    stream->shutdownWrite();
    return stream->readAllText().wait(io_.waitScope).cStr();
  }

  kj::AsyncIoContext io_;
  kj::HttpHeaderId allowHeader_;
  kj::Own<kj::HttpHeaderTable> headerTable_;
  int scrapes_ = 0;
  bool failNext_ = false;
  MetricsServer server_;
  std::uint16_t port_ = 0;
  kj::Promise<void> serving_ = nullptr;
};

TEST_F(MetricsServerTest, ServesMetrics) {
  Scrape scrape = request(kj::HttpMethod::GET, "/metrics");
  EXPECT_EQ(scrape.status, 200u);
  EXPECT_EQ(scrape.contentType, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(scrape.contentType, kPrometheusContentType);
  EXPECT_NE(scrape.body.find("gpuproxy_info{backend=\"sim\",version=\"9.9.9\"} 1\n"),
            std::string::npos)
      << scrape.body;
  EXPECT_NE(scrape.body.find("gpuproxy_tenant_kernels_launched_total{tenant=\"team-a\"} 7\n"),
            std::string::npos)
      << scrape.body;
  EXPECT_EQ(server_.port(), port_);
  EXPECT_EQ(server_.url(), "http://127.0.0.1:" + std::to_string(port_) + "/metrics");
}

TEST_F(MetricsServerTest, EachScrapeTakesAFreshSnapshot) {
  EXPECT_NE(request(kj::HttpMethod::GET, "/metrics").body.find("gpuproxy_clients 1\n"),
            std::string::npos);
  EXPECT_NE(request(kj::HttpMethod::GET, "/metrics").body.find("gpuproxy_clients 2\n"),
            std::string::npos);
  // Query parameters (some scrapers add them) do not change the path.
  EXPECT_NE(request(kj::HttpMethod::GET, "/metrics?name[]=x").body.find("gpuproxy_clients 3\n"),
            std::string::npos);
  EXPECT_EQ(scrapes_, 3);
}

TEST_F(MetricsServerTest, OtherPathsAreNotFound) {
  for (kj::StringPtr path : {"/", "/metricsx", "/metrics/", "/favicon.ico"}) {
    Scrape scrape = request(kj::HttpMethod::GET, path);
    EXPECT_EQ(scrape.status, 404u) << path.cStr();
    EXPECT_NE(scrape.body.find("/metrics"), std::string::npos);
  }
  EXPECT_EQ(scrapes_, 0);
}

TEST_F(MetricsServerTest, OnlyGetAndHeadAreAllowed) {
  for (kj::HttpMethod method :
       {kj::HttpMethod::POST, kj::HttpMethod::PUT, kj::HttpMethod::DELETE, kj::HttpMethod::PATCH}) {
    Scrape scrape = request(method, "/metrics");
    EXPECT_EQ(scrape.status, 405u) << kj::str(method).cStr();
    EXPECT_EQ(scrape.allow, "GET, HEAD");
  }
  EXPECT_EQ(scrapes_, 0);

  Scrape head = request(kj::HttpMethod::HEAD, "/metrics");
  EXPECT_EQ(head.status, 200u);
  EXPECT_EQ(head.contentType, kPrometheusContentType);
  EXPECT_EQ(head.body, "");
}

TEST_F(MetricsServerTest, FailedSnapshotIsAServerErrorAndServingGoesOn) {
  failNext_ = true;
  Scrape failed = request(kj::HttpMethod::GET, "/metrics");
  EXPECT_EQ(failed.status, 500u);
  EXPECT_NE(failed.body.find("state is locked"), std::string::npos) << failed.body;
  EXPECT_EQ(request(kj::HttpMethod::GET, "/metrics").status, 200u);
}

TEST_F(MetricsServerTest, WireFormat) {
  std::string reply =
      rawExchange("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << reply;
  std::size_t bodyStart = reply.find("\r\n\r\n");
  ASSERT_NE(bodyStart, std::string::npos);
  std::string body = reply.substr(bodyStart + 4);
  EXPECT_NE(reply.find("\r\nContent-Length: " + std::to_string(body.size()) + "\r\n"),
            std::string::npos)
      << reply;
  EXPECT_EQ(body.rfind("# HELP gpuproxy_info ", 0), 0u) << body;

  // Junk gets an error reply (kj's: 501 for an unknown method), and serving goes on.
  std::string garbage = rawExchange("NOT HTTP AT ALL\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 5", 0), 0u) << garbage;
  EXPECT_EQ(request(kj::HttpMethod::GET, "/metrics").status, 200u);
}

TEST(MetricsServer, BadAddressesAreRejectedClearly) {
  auto io = kj::setupAsyncIo();
  auto fill = [](protocol::DaemonStatus::Builder) -> kj::Promise<void> { return kj::READY_NOW; };
  struct Case {
    const char* address;
    const char* mentions;
  };
  for (const Case& c : {
           Case{"", "empty"},
           Case{"127.0.0.1", "missing ':PORT'"},
           Case{"127.0.0.1:", "not a number"},
           Case{"127.0.0.1:http", "not a number"},
           Case{"127.0.0.1:65536", "above 65535"},
           Case{"127.0.0.1:123456", "not a number"},
           Case{":9400", "missing host"},
           Case{"::1:9400", "brackets"},
           Case{"[::1", "missing ']'"},
           Case{"[::1]", "missing ':PORT'"},
           Case{"[]:9400", "empty IPv6"},
           Case{"unix:/run/gpuproxy/metrics.sock", "TCP"},
       }) {
    EXPECT_THROW(MetricsServer::checkAddress(c.address), MetricsAddressError) << c.address;
    MetricsServer server(io.provider->getNetwork(), io.provider->getTimer(), c.address, fill);
    try {
      server.start(io.waitScope);
      ADD_FAILURE() << "accepted '" << c.address << "'";
    } catch (const MetricsAddressError& error) {
      std::string what = error.what();
      EXPECT_NE(what.find(c.mentions), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + c.address + "'"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(MetricsServer, GoodAddressesPassTheCheck) {
  for (const char* address : {"127.0.0.1:9400", "0.0.0.0:0", "[::1]:9400", "localhost:65535"}) {
    EXPECT_NO_THROW(MetricsServer::checkAddress(address)) << address;
  }
}

TEST(MetricsServer, PortInUseIsAClearError) {
  auto io = kj::setupAsyncIo();
  auto fill = [](protocol::DaemonStatus::Builder) -> kj::Promise<void> { return kj::READY_NOW; };
  MetricsServer first(io.provider->getNetwork(), io.provider->getTimer(), "127.0.0.1:0", fill);
  std::uint16_t port = first.start(io.waitScope);
  std::string address = "127.0.0.1:" + std::to_string(port);
  MetricsServer second(io.provider->getNetwork(), io.provider->getTimer(), address, fill);
  try {
    second.start(io.waitScope);
    ADD_FAILURE() << "bound " << address << " twice";
  } catch (const MetricsAddressError& error) {
    std::string what = error.what();
    EXPECT_NE(what.find("cannot listen for metrics on " + address), std::string::npos) << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(MetricsServer, ServesOnIpv6Loopback) {
  auto io = kj::setupAsyncIo();
  MetricsServer server(io.provider->getNetwork(), io.provider->getTimer(), "[::1]:0",
                       [](protocol::DaemonStatus::Builder status) -> kj::Promise<void> {
                         status.setBackend("sim");
                         return kj::READY_NOW;
                       });
  std::uint16_t port = 0;
  try {
    port = server.start(io.waitScope);
  } catch (const MetricsAddressError& error) {
    GTEST_SKIP() << "no IPv6 loopback here: " << error.what();
  }
  EXPECT_EQ(server.url(), "http://[::1]:" + std::to_string(port) + "/metrics");
  auto serving = server.listen().eagerlyEvaluate(nullptr);
  kj::HttpHeaderTable table;
  auto address = io.provider->getNetwork().parseAddress("[::1]", port).wait(io.waitScope);
  auto client = kj::newHttpClient(io.provider->getTimer(), table, *address);
  kj::HttpHeaders headers(table);
  auto response =
      client->request(kj::HttpMethod::GET, "/metrics", headers).response.wait(io.waitScope);
  EXPECT_EQ(response.statusCode, 200u);
  std::string body = response.body->readAllText().wait(io.waitScope).cStr();
  EXPECT_NE(body.find("backend=\"sim\""), std::string::npos) << body;
}

}  // namespace
}  // namespace gpuproxy::server
