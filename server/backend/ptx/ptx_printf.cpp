#include "server/backend/ptx/ptx_printf.hpp"

#include <cstdio>
#include <cstring>

namespace gpuproxy::server::ptx {

bool readDeviceString(ExecContext& context, std::uint32_t lane, std::uint64_t address,
                      std::string& out) {
  out.clear();
  if (address == 0) {
    out = "(null)";
    return true;
  }
  while (out.size() < kMaxPrintfString) {
    const std::byte* where =
        translate(context, Space::kGeneric, address + out.size(), 1, 1, lane, false);
    if (where == nullptr) return false;
    const char c = static_cast<char>(*where);
    if (c == '\0') return true;
    out.push_back(c);
  }
  return true;
}

namespace {

bool readArgument(ExecContext& context, std::uint32_t lane, std::uint64_t arguments,
                  std::uint64_t& offset, unsigned bytes, std::uint64_t& value) {
  offset = (offset + bytes - 1) / bytes * bytes;
  const std::byte* where =
      translate(context, Space::kGeneric, arguments + offset, bytes, bytes, lane, false);
  if (where == nullptr) return false;
  value = 0;
  std::memcpy(&value, where, bytes);
  offset += bytes;
  return true;
}

}  // namespace

PrintfResult formatDevicePrintf(ExecContext& context, std::uint32_t lane, std::uint64_t format,
                                std::uint64_t arguments) {
  PrintfResult result;
  std::string pattern;
  if (!readDeviceString(context, lane, format, pattern)) return result;
  result.ok = true;
  std::uint64_t offset = 0;
  std::size_t i = 0;
  char buffer[512];
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c != '%') {
      result.text.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      result.text.push_back('%');
      i += 2;
      continue;
    }
    // %[flags][width][.precision][length]conversion
    const std::size_t start = i++;
    std::string spec = "%";
    while (i < pattern.size() && std::strchr("-+ #0", pattern[i]) != nullptr) spec += pattern[i++];
    int starArguments = 0;
    std::uint64_t stars[2] = {0, 0};
    auto digitsOrStar = [&]() {
      if (i < pattern.size() && pattern[i] == '*') {
        ++i;
        std::uint64_t value = 0;
        if (starArguments >= 2 || !readArgument(context, lane, arguments, offset, 4, value)) {
          return false;
        }
        stars[starArguments++] = value;
        spec += '*';
        return true;
      }
      while (i < pattern.size() && pattern[i] >= '0' && pattern[i] <= '9' && spec.size() < 16) {
        spec += pattern[i++];
      }
      return true;
    };
    if (!digitsOrStar()) {
      result.ok = context.fault == nullptr || context.fault->status == CUDA_SUCCESS;
      result.arguments = -1;
      return result;
    }
    if (i < pattern.size() && pattern[i] == '.') {
      spec += pattern[i++];
      if (!digitsOrStar()) {
        result.ok = context.fault == nullptr || context.fault->status == CUDA_SUCCESS;
        result.arguments = -1;
        return result;
      }
    }
    int longs = 0;
    while (i < pattern.size() && std::strchr("hlLqjzt", pattern[i]) != nullptr) {
      const char length = pattern[i++];
      if (length == 'l' || length == 'q' || length == 'j' || length == 'z' || length == 't' ||
          length == 'L') {
        ++longs;
      }
    }
    if (i >= pattern.size()) {
      result.text.append(pattern, start, std::string::npos);
      break;
    }
    const char conversion = pattern[i++];
    if (++result.arguments > static_cast<int>(kMaxPrintfArguments)) {
      result.text.append(pattern, start, i - start);
      continue;
    }
    std::uint64_t value = 0;
    int written = 0;
    auto emit = [&](auto argument, const std::string& full) {
      if (starArguments == 0) {
        written = std::snprintf(buffer, sizeof buffer, full.c_str(), argument);
      } else if (starArguments == 1) {
        written = std::snprintf(buffer, sizeof buffer, full.c_str(), static_cast<int>(stars[0]),
                                argument);
      } else {
        written = std::snprintf(buffer, sizeof buffer, full.c_str(), static_cast<int>(stars[0]),
                                static_cast<int>(stars[1]), argument);
      }
      if (written > 0) {
        result.text.append(
            buffer, std::min<std::size_t>(static_cast<std::size_t>(written), sizeof buffer - 1));
      }
    };
    switch (conversion) {
      case 'd':
      case 'i':
        if (!readArgument(context, lane, arguments, offset, longs > 0 ? 8 : 4, value)) return {};
        emit(longs > 0 ? static_cast<long long>(value)
                       : static_cast<long long>(static_cast<std::int32_t>(value)),
             spec + "lld");
        break;
      case 'u':
      case 'x':
      case 'X':
      case 'o':
        if (!readArgument(context, lane, arguments, offset, longs > 0 ? 8 : 4, value)) return {};
        emit(longs > 0 ? static_cast<unsigned long long>(value)
                       : static_cast<unsigned long long>(static_cast<std::uint32_t>(value)),
             spec + "ll" + conversion);
        break;
      case 'c':
        if (!readArgument(context, lane, arguments, offset, 4, value)) return {};
        emit(static_cast<int>(value & 0xff), spec + "c");
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
      case 'a':
      case 'A': {
        if (!readArgument(context, lane, arguments, offset, 8, value)) return {};
        double number = 0;
        std::memcpy(&number, &value, sizeof number);
        emit(number, spec + conversion);
        break;
      }
      case 'p':
        if (!readArgument(context, lane, arguments, offset, 8, value)) return {};
        emit(reinterpret_cast<void*>(static_cast<std::uintptr_t>(value)), spec + "p");
        break;
      case 's': {
        if (!readArgument(context, lane, arguments, offset, 8, value)) return {};
        std::string text;
        if (!readDeviceString(context, lane, value, text)) return {};
        if (spec == "%") {
          result.text += text;
        } else {
          emit(text.c_str(), spec + "s");
        }
        break;
      }
      default:
        // Not a conversion printf knows: printed as written, as the CUDA runtime does.
        result.text.append(pattern, start, i - start);
        --result.arguments;
        break;
    }
  }
  return result;
}

}  // namespace gpuproxy::server::ptx
