#pragma once
// What every benchmark program shares: argument parsing, timing, percentiles and Markdown tables.
//
// The suite uses plain mains rather than Google Benchmark because what it must show is the
// distribution of single calls (median/p90/p99 of one cuLaunchKernel), several paths interleaved
// in one run so that a noisy machine hurts them alike, and ratios against those same-run
// baselines; Google Benchmark reports means of batches and runs its cases one after the other.
// Tables are Markdown so that a run can be pasted into RESULTS.md as it is.

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace gpuproxy::bench {

// Where this process's CUDA calls go, from GPUPROXY_TRANSPORT as benchmarks/run sets it: "ring"
// (default) and "rpc" are the stub's two transports to the daemon (the stub reads the variable at
// cuInit; rpc is the earlier Cap'n-Proto-for-every-call path, kept as a baseline); "native" means
// the stub is not on the loader path at all and the calls reach the NVIDIA driver itself, the
// baseline on a machine with a GPU (the stub never sees that value).
enum class CallPath { kRing, kRpc, kNative };

inline CallPath callPath() {
  const char* transport = std::getenv("GPUPROXY_TRANSPORT");
  const std::string_view value = transport != nullptr ? transport : "";
  if (value == "rpc") return CallPath::kRpc;
  if (value == "native") return CallPath::kNative;
  return CallPath::kRing;
}

inline bool nativeDriver() {
  return callPath() == CallPath::kNative;
}

// The stub's transport, for tables: "shm ring", "Cap'n Proto" or "native driver".
inline std::string stubTransport() {
  switch (callPath()) {
    case CallPath::kRpc:
      return "Cap'n Proto";
    case CallPath::kNative:
      return "native driver";
    case CallPath::kRing:
      break;
  }
  return "shm ring";
}

// The measured path as a table row names it.
inline std::string callPathLabel() {
  return nativeDriver() ? "native driver, no gpuproxy"
                        : "stub -> gpuproxyd (" + stubTransport() + ")";
}

inline std::int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- errors ------------------------------------------------------------------------------------

[[noreturn]] inline void failCuda(const char* program, const char* call, CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "%s: %s failed: %s (%d)\n", program, call, name, static_cast<int>(result));
  std::exit(1);
}

[[noreturn]] inline void failUsage(const char* program, const std::string& message) {
  std::fprintf(stderr, "%s: %s (try --help)\n", program, message.c_str());
  std::exit(2);
}

// ---- arguments ---------------------------------------------------------------------------------

// Accepts 4096, 4K, 4KiB, 64MiB, 1G (binary multiples either way: these are buffer sizes).
inline bool parseBytes(std::string_view text, std::uint64_t& out) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return false;
  std::uint64_t value = std::strtoull(std::string(text.substr(0, digits)).c_str(), nullptr, 10);
  std::string suffix(text.substr(digits));
  std::uint64_t multiplier = 1;
  if (suffix.empty() || suffix == "B")
    multiplier = 1;
  else if (suffix == "K" || suffix == "KiB" || suffix == "KB")
    multiplier = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB" || suffix == "MB")
    multiplier = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB" || suffix == "GB")
    multiplier = 1ull << 30;
  else
    return false;
  out = value * multiplier;
  return true;
}

// A comma-separated list of positive integers: "1,2,4,8".
inline bool parseIntList(std::string_view text, std::vector<int>& out) {
  out.clear();
  while (!text.empty()) {
    std::size_t comma = text.find(',');
    std::string item(text.substr(0, comma));
    char* end = nullptr;
    long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value <= 0) return false;
    out.push_back(static_cast<int>(value));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return !out.empty();
}

// Minimal "--name value" parsing; every program lists its options in its --help.
class Args {
public:
  Args(const char* program, int argc, char** argv) : program_(program), argc_(argc), argv_(argv) {}

  bool next() { return ++index_ < argc_; }
  std::string_view current() const { return argv_[index_]; }
  bool is(std::string_view name) const { return current() == name; }

  std::string_view value() {
    if (index_ + 1 >= argc_) failUsage(program_, std::string(current()) + " needs a value");
    return argv_[++index_];
  }
  long integer(long minimum) {
    std::string_view name = current();
    std::string text(value());
    char* end = nullptr;
    long parsed = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || parsed < minimum) {
      failUsage(program_, std::string(name) + " takes an integer >= " + std::to_string(minimum));
    }
    return parsed;
  }
  double number(double minimum) {
    std::string_view name = current();
    std::string text(value());
    char* end = nullptr;
    double parsed = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || parsed < minimum) {
      failUsage(program_, std::string(name) + " takes a number >= " + std::to_string(minimum));
    }
    return parsed;
  }
  std::uint64_t bytes() {
    std::string_view name = current();
    std::uint64_t parsed = 0;
    if (!parseBytes(value(), parsed) || parsed == 0) {
      failUsage(program_, std::string(name) + " takes a size such as 4KiB or 256MiB");
    }
    return parsed;
  }
  [[noreturn]] void unknown() const {
    failUsage(program_, "unknown argument " + std::string(current()));
  }

private:
  const char* program_;
  int argc_;
  char** argv_;
  int index_ = 0;
};

// ---- statistics --------------------------------------------------------------------------------

struct LatencySummary {
  std::size_t samples = 0;
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double mean = 0;
  double min = 0;
};

// Nearest-rank percentile of sorted values; p in [0, 100].
inline double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  return sorted[static_cast<std::size_t>(rank + 0.5)];
}

inline LatencySummary summarize(std::vector<double> values) {
  LatencySummary summary;
  if (values.empty()) return summary;
  std::sort(values.begin(), values.end());
  summary.samples = values.size();
  summary.median = percentile(values, 50);
  summary.p90 = percentile(values, 90);
  summary.p99 = percentile(values, 99);
  summary.min = values.front();
  double total = 0;
  for (double value : values) total += value;
  summary.mean = total / static_cast<double>(values.size());
  return summary;
}

inline double median(std::vector<double> values) {
  return summarize(std::move(values)).median;
}

// What two back-to-back clock reads cost: the floor under every per-call sample.
inline double clockOverheadNs() {
  std::vector<double> samples;
  samples.reserve(10000);
  for (int i = 0; i < 10000; ++i) {
    std::int64_t start = nowNs();
    std::int64_t end = nowNs();
    samples.push_back(static_cast<double>(end - start));
  }
  return median(std::move(samples));
}

// ---- output ------------------------------------------------------------------------------------

inline std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), pattern, value);
  return buffer;
}

inline std::string formatNs(double ns) {
  return format(ns < 100 ? "%.1f" : "%.0f", ns);
}

inline std::string formatRatio(double ratio) {
  if (ratio < 0.01) return format("%.4fx", ratio);
  return format(ratio < 10 ? "%.2fx" : "%.0fx", ratio);
}

inline std::string formatPercent(double fraction) {
  return format("%.0f%%", fraction * 100);
}

inline std::string formatSize(std::uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0)
    return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// A Markdown table with right-aligned numeric columns (every column but the first).
class Table {
public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}

  void add(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }

  void print(std::FILE* out = stdout) const {
    std::vector<std::size_t> widths(header_.size(), 3);
    for (std::size_t c = 0; c < header_.size(); ++c) {
      widths[c] = std::max(widths[c], header_[c].size());
      for (const auto& row : rows_) widths[c] = std::max(widths[c], row[c].size());
    }
    auto line = [&](const std::vector<std::string>& cells) {
      std::fputs("|", out);
      for (std::size_t c = 0; c < cells.size(); ++c) {
        int width = static_cast<int>(widths[c]);
        if (c == 0)
          std::fprintf(out, " %-*s |", width, cells[c].c_str());
        else
          std::fprintf(out, " %*s |", width, cells[c].c_str());
      }
      std::fputs("\n", out);
    };
    line(header_);
    std::fputs("|", out);
    for (std::size_t c = 0; c < widths.size(); ++c) {
      std::string dashes(widths[c], '-');
      if (c == 0)
        std::fprintf(out, " %s |", dashes.c_str());
      else
        std::fprintf(out, " %s: |", dashes.substr(1).c_str());
    }
    std::fputs("\n", out);
    for (const auto& row : rows_) line(row);
    std::fflush(out);
  }

private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// The device the driver in front of us reports: "gpuproxy sim device 0" through the stub and the
// simulator, the GPU's own name natively. Printed so a table says what it measured.
inline std::string deviceName(CUdevice device) {
  char name[256] = {};
  if (cuDeviceGetName(name, sizeof(name), device) != CUDA_SUCCESS) return "(unknown)";
  return name;
}

}  // namespace gpuproxy::bench
