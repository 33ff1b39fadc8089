#pragma once
// Byte sizes as operators write them: "16GiB", "512MiB", "4GB", "1048576". Shared by gpuproxyd's
// flags and gpuproxyctl so both read sizes the same way.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpuproxy::protocol {

// Accepts an unsigned integer with an optional suffix: B, K/KB, M/MB, G/GB, T/TB (powers of 1000)
// and KiB, MiB, GiB, TiB (powers of 1024); case-insensitive, optional space before the suffix.
// nullopt for anything else, including overflow past 2^64-1.
std::optional<std::uint64_t> parseByteSize(std::string_view text);

// "16 GiB", "1.5 MiB", "512 B": for tables meant for people.
std::string formatByteSize(std::uint64_t bytes);

}  // namespace gpuproxy::protocol
