#pragma once
// The daemon's status in the Prometheus text exposition format (version 0.0.4), for the
// `--metrics-address` HTTP endpoint. Pure: a snapshot in, text out, so it is tested without a
// server.

#include "gpuproxy/protocol/gpuproxy.capnp.h"

#include <string>
#include <string_view>

namespace gpuproxy::server {

// The Content-Type Prometheus expects for this format.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Every metric family the daemon exports, `# HELP` and `# TYPE` first, ending in a newline.
// Families without samples (no tenants, no limited tenant) are left out.
std::string renderPrometheus(protocol::DaemonStatus::Reader status);

// A label value with backslash, double quote and newline escaped, as the format requires.
std::string escapeLabelValue(std::string_view value);

}  // namespace gpuproxy::server
