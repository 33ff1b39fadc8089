#include "protocol/cuda_result.hpp"

#include <algorithm>
#include <iterator>

namespace gpuproxy::protocol {
namespace {

struct ResultInfo {
  CUresult result;
  // Both point at string literals, so callers (cuGetErrorString) may hand out .data() as a
  // NUL-terminated C string.
  std::string_view name;
  std::string_view description;
};

constexpr ResultInfo kResults[] = {
#include "generated/cuda_result_table.inc"
};

static_assert(std::ranges::is_sorted(kResults, {}, &ResultInfo::result),
              "gen.py emits the table sorted by value, for binary search");

int codeOf(const ResultInfo& info) {
  return static_cast<int>(info.result);
}

const ResultInfo* find(int code) {
  const auto* it = std::ranges::lower_bound(kResults, code, {}, codeOf);
  if (it == std::end(kResults) || codeOf(*it) != code) return nullptr;
  return it;
}

}  // namespace

std::optional<std::string_view> cudaResultName(int code) {
  const ResultInfo* info = find(code);
  if (info == nullptr) return std::nullopt;
  return info->name;
}

std::optional<std::string_view> cudaResultDescription(int code) {
  const ResultInfo* info = find(code);
  if (info == nullptr) return std::nullopt;
  return info->description;
}

std::string_view cudaResultNameOr(int code, std::string_view fallback) {
  const ResultInfo* info = find(code);
  return info != nullptr ? info->name : fallback;
}

}  // namespace gpuproxy::protocol
