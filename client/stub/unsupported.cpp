#include "client/stub/unsupported.hpp"

#include <mutex>
#include <string>
#include <unordered_set>

#include "client/stub/log.hpp"

namespace gpuproxy::client {
namespace {

struct ReportedNames {
  std::mutex mutex;
  std::unordered_set<std::string> names;
};

// Created on first use and never destroyed: the application may call an unsupported function
// from a thread that outlives static destruction, and the stub must not run work at load time.
ReportedNames& reportedNames() {
  static auto* const names = new ReportedNames;
  return *names;
}

}  // namespace

CUresult reportUnsupported(const char* name) noexcept {
  try {
    if (name == nullptr || !stub::logEnabled(stub::LogLevel::kWarn)) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    ReportedNames& reported = reportedNames();
    bool first = false;
    {
      std::lock_guard lock(reported.mutex);
      first = reported.names.emplace(name).second;
    }
    if (first) stub::logMessage(stub::LogLevel::kWarn, "%s is not supported", name);
  } catch (...) {
    // Out of memory while remembering the name: the answer matters more than the log line.
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace gpuproxy::client
