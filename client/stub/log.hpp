#pragma once
// The stub's own logging: one line per message on stderr, prefixed "gpuproxy: ", level from
// $GPUPROXY_LOG_LEVEL (error|warn|info|debug|off, default warn).
//
// Deliberately not spdlog: the stub logs from whatever thread and whatever moment the application
// calls it, including static destructors at process exit, after spdlog's registry may already be
// gone. A single write(2) per line has no global state to outlive and does not interleave lines.

namespace gpuproxy::stub {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Read from the environment once, on first use.
LogLevel logLevel() noexcept;

inline bool logEnabled(LogLevel level) noexcept {
  return level != LogLevel::kOff && level >= logLevel();
}

// printf-style; never throws.
void logMessage(LogLevel level, const char* format, ...) noexcept
    __attribute__((format(printf, 2, 3)));

}  // namespace gpuproxy::stub

// The format arguments are evaluated only when the level is enabled.
#define GPUPROXY_STUB_LOG(level, ...)                                               \
  do {                                                                              \
    if (::gpuproxy::stub::logEnabled(::gpuproxy::stub::LogLevel::level))            \
      ::gpuproxy::stub::logMessage(::gpuproxy::stub::LogLevel::level, __VA_ARGS__); \
  } while (false)
