#pragma once
// Prometheus metrics over HTTP (`--metrics-address`): GET /metrics answers with the daemon's
// status rendered by renderPrometheus(), on the daemon's own kj event loop. Each scrape takes a
// fresh snapshot through the callback, so it sees exactly what `gpuproxyctl status` would.

#include "gpuproxy/protocol/gpuproxy.capnp.h"

#include <kj/async-io.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace kj {
class HttpHeaderTable;
class HttpServer;
}  // namespace kj

namespace gpuproxy::server {

// Why the metrics address cannot be served; what() is one line naming the address.
class MetricsAddressError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class MetricsServer {
public:
  // Fills a fresh, empty status for one scrape, which lives until the promise resolves. Called
  // on the event loop thread.
  using FillStatus = std::function<kj::Promise<void>(protocol::DaemonStatus::Builder)>;

  // `address` is HOST:PORT: an IPv4 address or host name, or [IPv6]:PORT; port 0 picks a free
  // port. Nothing is bound until start().
  MetricsServer(kj::Network& network, kj::Timer& timer, std::string address, FillStatus fill);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Throws MetricsAddressError unless `address` has the HOST:PORT shape start() accepts. Binds and
  // resolves nothing, so option parsing can reject a typo before any device is opened.
  static void checkAddress(const std::string& address);

  // Parses and binds the address, waiting on `waitScope` only while a host name resolves.
  // Returns the bound port. Throws MetricsAddressError for a malformed address or a failed bind.
  std::uint16_t start(kj::WaitScope& waitScope);

  // Serves connections until the promise is dropped, which must happen before this object is
  // destroyed. Requires start().
  kj::Promise<void> listen();

  std::uint16_t port() const { return port_; }
  const std::string& address() const { return address_; }
  // http://HOST:PORT/metrics with the bound port, for the daemon's log line.
  std::string url() const;

private:
  class Service;

  kj::Network& network_;
  kj::Timer& timer_;
  std::string address_;
  std::string host_;  // as written, brackets included for IPv6
  std::uint16_t port_ = 0;
  kj::Own<kj::HttpHeaderTable> headerTable_;
  std::unique_ptr<Service> service_;
  kj::Own<kj::HttpServer> httpServer_;
  kj::Own<kj::ConnectionReceiver> receiver_;
};

}  // namespace gpuproxy::server
