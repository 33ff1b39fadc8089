#include "client/stub/log.hpp"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpuproxy::stub {

namespace {

LogLevel parseLevel(const char* text) noexcept {
  if (text == nullptr || *text == '\0') return LogLevel::kWarn;
  if (std::strcmp(text, "debug") == 0 || std::strcmp(text, "trace") == 0) return LogLevel::kDebug;
  if (std::strcmp(text, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(text, "warn") == 0 || std::strcmp(text, "warning") == 0) return LogLevel::kWarn;
  if (std::strcmp(text, "error") == 0) return LogLevel::kError;
  if (std::strcmp(text, "off") == 0 || std::strcmp(text, "none") == 0) return LogLevel::kOff;
  return LogLevel::kWarn;
}

}  // namespace

LogLevel logLevel() noexcept {
  // A function-local static of a trivially destructible type: no constructor runs at load time
  // and nothing is torn down at exit.
  static const LogLevel level = parseLevel(std::getenv("GPUPROXY_LOG_LEVEL"));
  return level;
}

void logMessage(LogLevel level, const char* format, ...) noexcept {
  (void)level;  // the level decides whether to log (the caller checked); lines look alike
  char line[1024];
  static constexpr char kPrefix[] = "gpuproxy: ";
  constexpr int prefix = sizeof(kPrefix) - 1;
  std::memcpy(line, kPrefix, prefix);
  va_list arguments;
  va_start(arguments, format);
  int body = std::vsnprintf(line + prefix, sizeof(line) - static_cast<std::size_t>(prefix) - 1,
                            format, arguments);
  va_end(arguments);
  if (body < 0) return;
  std::size_t length = static_cast<std::size_t>(prefix) + static_cast<std::size_t>(body);
  if (length > sizeof(line) - 2) length = sizeof(line) - 2;  // truncated message
  line[length++] = '\n';
  // One write per line so that lines from several threads do not interleave. A short write to
  // stderr is not worth retrying for a log line.
  [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, line, length);
}

}  // namespace gpuproxy::stub
