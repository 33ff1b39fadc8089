#include "server/metrics/metrics_server.hpp"

#include "server/metrics/prometheus_text.hpp"

#include <capnp/message.h>
#include <kj/compat/http.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <string_view>
#include <utility>

namespace gpuproxy::server {

namespace {

constexpr std::string_view kMetricsPath = "/metrics";
constexpr const char kPlainText[] = "text/plain; charset=utf-8";

// kj descriptions can span lines; the daemon reports this as a one-line exit reason.
std::string oneLine(kj::StringPtr text) {
  std::string line(text.cStr(), text.size());
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
};

// Checked here rather than left to kj: kj would quietly accept a missing port (picking port 0),
// a Unix socket path or a bare IPv6 address, none of which is what an operator meant.
HostPort parseHostPort(const std::string& address) {
  auto fail = [&address](const std::string& why) -> MetricsAddressError {
    return MetricsAddressError("metrics address '" + address + "': " + why +
                               " (expected HOST:PORT, e.g. 127.0.0.1:9400 or [::1]:9400)");
  };
  if (address.empty()) throw fail("empty");
  if (address.rfind("unix:", 0) == 0 || address.find('/') != std::string::npos) {
    throw fail("metrics are served over TCP, not a socket path");
  }
  HostPort result;
  std::string portText;
  if (address.front() == '[') {
    std::size_t close = address.find(']');
    if (close == std::string::npos) throw fail("missing ']' after the IPv6 address");
    if (close == 1) throw fail("empty IPv6 address");
    if (close + 1 >= address.size() || address[close + 1] != ':') throw fail("missing ':PORT'");
    result.host = address.substr(0, close + 1);
    portText = address.substr(close + 2);
  } else {
    std::size_t colon = address.rfind(':');
    if (colon == std::string::npos) throw fail("missing ':PORT'");
    result.host = address.substr(0, colon);
    if (result.host.find(':') != std::string::npos) throw fail("put an IPv6 address in brackets");
    if (result.host.empty()) throw fail("missing host");
    portText = address.substr(colon + 1);
  }
  if (portText.empty() || portText.size() > 5 ||
      !std::all_of(portText.begin(), portText.end(),
                   [](unsigned char c) { return std::isdigit(c) != 0; })) {
    throw fail("port '" + portText + "' is not a number from 0 to 65535");
  }
  unsigned long port = std::stoul(portText);
  if (port > 65535) throw fail("port " + portText + " is above 65535");
  result.port = static_cast<std::uint16_t>(port);
  return result;
}

}  // namespace

class MetricsServer::Service final : public kj::HttpService {
public:
  Service(const kj::HttpHeaderTable& headerTable, FillStatus fill)
      : headerTable_(headerTable), fill_(std::move(fill)) {}

  // kj::HttpService
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream&, Response& response) override {
    std::string_view target(url.cStr(), url.size());
    std::string_view path = target.substr(0, target.find('?'));  // scrapers may add parameters
    if (path != kMetricsPath) {
      return sendText(response, 404, "Not Found", kPlainText,
                      "not found: metrics are at /metrics\n");
    }
    if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
      return sendText(response, 405, "Method Not Allowed", kPlainText,
                      "method not allowed: use GET\n", true);
    }
    // A failure to take the snapshot, now or once every GPU has given its part, is a 500.
    auto message = kj::heap<capnp::MallocMessageBuilder>();
    auto status = message->initRoot<protocol::DaemonStatus>();
    return kj::evalNow([&] { return fill_(status); })
        .then(
            [this, &response, status, message = kj::mv(message)]() mutable {
              std::string body;
              try {
                body = renderPrometheus(status.asReader());
              } catch (const std::exception& error) {
                return failScrape(response, error.what());
              }
              return sendText(response, 200, "OK", kPrometheusContentType, std::move(body));
            },
            [this, &response](kj::Exception&& error) {
              return failScrape(response, oneLine(error.getDescription()));
            });
  }

private:
  kj::Promise<void> failScrape(Response& response, const std::string& why) {
    spdlog::warn("metrics scrape failed: {}", why);
    return sendText(response, 500, "Internal Server Error", kPlainText,
                    "cannot collect metrics: " + why + "\n");
  }

  kj::Promise<void> sendText(Response& response, unsigned code, kj::StringPtr statusText,
                             std::string_view contentType, std::string body,
                             bool allowGet = false) {
    kj::HttpHeaders headers(headerTable_);
    std::string type(contentType);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, type.c_str());
    if (allowGet) headers.add("Allow", "GET, HEAD");
    auto stream = response.send(code, statusText, headers, body.size());
    // The body must outlive the write; a HEAD response's stream discards it.
    auto owned = std::make_unique<std::string>(std::move(body));
    auto written = stream->write(owned->data(), owned->size());
    return written.attach(kj::mv(stream), kj::mv(owned));
  }

  const kj::HttpHeaderTable& headerTable_;
  FillStatus fill_;
};

MetricsServer::MetricsServer(kj::Network& network, kj::Timer& timer, std::string address,
                             FillStatus fill)
    : network_(network),
      timer_(timer),
      address_(std::move(address)),
      headerTable_(kj::heap<kj::HttpHeaderTable>()),
      service_(std::make_unique<Service>(*headerTable_, std::move(fill))),
      httpServer_(kj::heap<kj::HttpServer>(timer_, *headerTable_, *service_)) {}

MetricsServer::~MetricsServer() = default;

void MetricsServer::checkAddress(const std::string& address) {
  parseHostPort(address);
}

std::uint16_t MetricsServer::start(kj::WaitScope& waitScope) {
  HostPort hostPort = parseHostPort(address_);
  host_ = hostPort.host;
  kj::Own<kj::NetworkAddress> resolved;
  try {
    resolved = network_.parseAddress(kj::str(host_.c_str(), ":", hostPort.port)).wait(waitScope);
  } catch (const kj::Exception& error) {
    throw MetricsAddressError("metrics address '" + address_ +
                              "': cannot resolve: " + oneLine(error.getDescription()));
  }
  try {
    receiver_ = resolved->listen();
  } catch (const kj::Exception& error) {
    throw MetricsAddressError("cannot listen for metrics on " + address_ + ": " +
                              oneLine(error.getDescription()));
  }
  port_ = static_cast<std::uint16_t>(receiver_->getPort());
  return port_;
}

kj::Promise<void> MetricsServer::listen() {
  KJ_REQUIRE(receiver_.get() != nullptr, "MetricsServer::listen() before start()");
  return httpServer_->listenHttp(*receiver_);
}

std::string MetricsServer::url() const {
  return "http://" + host_ + ":" + std::to_string(port_) + std::string(kMetricsPath);
}

}  // namespace gpuproxy::server
