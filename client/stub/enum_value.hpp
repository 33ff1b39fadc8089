#pragma once
// An enum argument from the application as the integer it holds. The application may pass any
// integer where the driver API takes an enum (an unknown attribute, a garbage error code), and
// reading an enum object whose value lies outside its enumerators' range is undefined behaviour;
// reading its bytes as an integer is not. Every entry point that switches on an enum it was
// given reads it through this.

#include <cstring>
#include <type_traits>

namespace gpuproxy::stub {

template <typename Enum>
int enumValue(const Enum& value) noexcept {
  static_assert(std::is_enum_v<Enum> && sizeof(Enum) == sizeof(int));
  int integer;
  std::memcpy(&integer, &value, sizeof integer);
  return integer;
}

}  // namespace gpuproxy::stub
