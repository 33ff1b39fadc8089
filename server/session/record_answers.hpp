#pragma once
// How a command record (protocol/RING_FORMAT.md) is answered: a record someone waits for answers
// its completion token; an asynchronous one that fails becomes an AsyncError the stub reports at
// its stream's next synchronising call; one that succeeds answers nothing. Shared by the session
// (Session.submit) and the executors of each GPU (gpu_command_executor.hpp).

#include "protocol/ring_format.hpp"
#include "server/data_plane/command_port.hpp"

#include <cuda.h>

#include <cstdint>
#include <type_traits>
#include <variant>

namespace gpuproxy::server {

// The completion token a command carries (0: none, or a command that has no such field).
inline std::uint64_t completionTokenOf(const protocol::ring::DecodedCommand& command) {
  return std::visit(
      [](const auto& decoded) -> std::uint64_t {
        if constexpr (requires { decoded.completionToken; }) {
          return decoded.completionToken;
        } else {
          return 0;
        }
      },
      command);
}

// The AsyncError that reports `command` failing with `result` at its stream's next
// synchronisation.
template <typename Command>
protocol::ring::AsyncError asyncErrorOf(const Command& command, CUresult result) {
  return protocol::ring::AsyncError{command.sequence, command.context, command.stream, result,
                                    static_cast<std::uint16_t>(Command::kOpcode)};
}

// Reports the outcome of an asynchronous command: nothing on success, an AsyncError otherwise.
template <typename Command>
void report(CommandPort& port, CUresult result, const Command& command) {
  if (result != CUDA_SUCCESS) port.postAsyncError(asyncErrorOf(command, result));
}

// Answers a command someone may wait for: its token if it has one, else as report() does.
template <typename Command>
void answer(CommandPort& port, CUresult result, std::uint64_t token, const Command& command) {
  if (token != 0) {
    port.postCompletion(token, result);
  } else {
    report(port, result, command);
  }
}

// Answers `command` with `result` without executing it: its waiter hears it, or else its stream's
// next synchronisation.
inline void failCommand(CommandPort& port, CUresult result,
                        const protocol::ring::DecodedCommand& command) {
  std::visit(
      [&](const auto& failed) {
        using Failed = std::decay_t<decltype(failed)>;
        if constexpr (std::is_same_v<Failed, protocol::ring::DecodeError>) {
          // already answered by the decoder's own rules
        } else if constexpr (requires { failed.stream; }) {
          if constexpr (requires { failed.completionToken; }) {
            answer(port, result, failed.completionToken, failed);
          } else {
            report(port, result, failed);
          }
        } else if constexpr (requires { failed.completionToken; }) {
          if (failed.completionToken != 0) port.postCompletion(failed.completionToken, result);
        }
      },
      command);
}

}  // namespace gpuproxy::server
