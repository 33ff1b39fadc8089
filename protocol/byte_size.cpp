#include "protocol/byte_size.hpp"

#include <array>
#include <cctype>
#include <cstdio>
#include <utility>

namespace gpuproxy::protocol {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<std::uint64_t> suffixMultiplier(std::string_view suffix) {
  static constexpr std::array<std::pair<std::string_view, std::uint64_t>, 14> kSuffixes{{
      {"", 1},
      {"b", 1},
      {"k", 1000ull},
      {"kb", 1000ull},
      {"m", 1000ull * 1000},
      {"mb", 1000ull * 1000},
      {"g", 1000ull * 1000 * 1000},
      {"gb", 1000ull * 1000 * 1000},
      {"t", 1000ull * 1000 * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
      {"kib", 1ull << 10},
      {"mib", 1ull << 20},
      {"gib", 1ull << 30},
      {"tib", 1ull << 40},
  }};
  std::string key = lower(suffix);
  for (const auto& [name, multiplier] : kSuffixes) {
    if (name == key) return multiplier;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> parseByteSize(std::string_view text) {
  std::size_t i = 0;
  std::uint64_t number = 0;
  bool sawDigit = false;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    std::uint64_t digit = static_cast<std::uint64_t>(text[i] - '0');
    if (number > (UINT64_MAX - digit) / 10) return std::nullopt;
    number = number * 10 + digit;
    sawDigit = true;
    ++i;
  }
  if (!sawDigit) return std::nullopt;
  if (i < text.size() && text[i] == ' ') ++i;
  auto multiplier = suffixMultiplier(text.substr(i));
  if (!multiplier) return std::nullopt;
  if (number != 0 && *multiplier > UINT64_MAX / number) return std::nullopt;
  return number * *multiplier;
}

std::string formatByteSize(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kUnits{"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  if (unit == 0) {
    std::snprintf(buffer, sizeof(buffer), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.1f %s", value, kUnits[unit].data());
  }
  return buffer;
}

}  // namespace gpuproxy::protocol
