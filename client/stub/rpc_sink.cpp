#include "client/stub/rpc_sink.hpp"

#include <kj/vector.h>

#include <algorithm>
#include <cstring>
#include <variant>
#include <vector>

#include "client/stub/device_output.hpp"
#include "client/stub/log.hpp"
#include "client/stub/runtime.hpp"
#include "protocol/overloaded.hpp"

namespace gpuproxy::stub {

namespace ring = protocol::ring;

namespace {

using protocol::Session;

constexpr std::size_t kChunk = protocol::MAX_TRANSFER_CHUNK;
// Calls in flight at once for a large copy: enough to keep the socket busy while the daemon
// copies, few enough that a 1 GiB copy does not build 1 GiB of messages before the first answer.
constexpr std::size_t kChunksInFlight = 4;
// The one token a call's records use: each call has its own answer.
constexpr std::uint64_t kToken = 1;

// What the daemon answered to one Session.submit.
struct SubmitAnswer {
  CUresult tokenResult = CUDA_SUCCESS;  // the Completion of kToken, if one was asked for
  CUresult asyncError = CUDA_SUCCESS;   // the first AsyncError, if any command failed
  bool deviceOutput = false;            // the daemon holds device printf output
};

// The record `command` encodes to.
std::vector<std::byte> encoded(const ring::Command& command) {
  std::vector<std::byte> record(
      std::visit([](const auto& body) { return ring::encodedSize(body); }, command));
  const std::size_t used =
      std::visit([&](const auto& body) { return ring::encode(body, record); }, command);
  record.resize(used);
  return record;
}

// Reads the completion records of an answer. A record this stub cannot read means a daemon of
// another version: CUDA_ERROR_UNKNOWN, logged.
SubmitAnswer readAnswer(capnp::Data::Reader completions) {
  SubmitAnswer answer;
  std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(completions.begin()),
                                  completions.size());
  while (rest.size() >= sizeof(ring::wire::CompletionHeader)) {
    ring::wire::CompletionHeader header{};
    std::memcpy(&header, rest.data(), sizeof(header));
    const std::size_t length = std::min<std::size_t>(header.length, rest.size());
    const ring::DecodedCompletion decoded =
        ring::decodeCompletion(rest.first(length), ring::SegmentLimits{});
    rest = rest.subspan(std::max<std::size_t>(length, sizeof(header)));
    std::visit(protocol::Overloaded{
                   [&](const ring::Completion& completion) {
                     if (completion.token == kToken) answer.tokenResult = completion.result;
                   },
                   [&](const ring::AsyncError& error) {
                     if (answer.asyncError == CUDA_SUCCESS) answer.asyncError = error.result;
                   },
                   [](const ring::StagingRelease&) {},
                   [&](const ring::DeviceOutput&) { answer.deviceOutput = true; },
                   [&](const ring::DecodeError& error) {
                     GPUPROXY_STUB_LOG(kError,
                                       "gpuproxyd answered with a record this stub cannot "
                                       "read: %s",
                                       std::string(ring::describe(error.failure)).c_str());
                     answer.asyncError = CUDA_ERROR_UNKNOWN;
                   },
               },
               decoded);
  }
  return answer;
}

// A submit request for `record` with `payload` and a buffer of `payloadBytes`.
kj::Promise<capnp::Response<Session::SubmitResults>> send(Session::Client& session,
                                                          const std::vector<std::byte>& record,
                                                          kj::ArrayPtr<const kj::byte> payload,
                                                          std::uint64_t payloadBytes) {
  auto request = session.submitRequest(
      capnp::MessageSize{(record.size() + payload.size()) / sizeof(capnp::word) + 64, 0});
  request.setCommands(
      kj::arrayPtr(reinterpret_cast<const kj::byte*>(record.data()), record.size()));
  if (payload.size() > 0) request.setPayload(payload);
  request.setPayloadBytes(payloadBytes);
  return request.send();
}

CUresult firstFailure(const kj::Array<CUresult>& results) {
  for (CUresult result : results) {
    if (result != CUDA_SUCCESS) return result;
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult RpcSink::enqueue(ring::Command& command) {
  std::visit([&](auto& body) { body.sequence = nextSequence(); }, command);
  const std::vector<std::byte> record = encoded(command);
  // What no record can represent (a parameter buffer past CUDA's limit) is an invalid argument.
  if (record.empty()) return CUDA_ERROR_INVALID_VALUE;
  return runtime_.call([&](Session::Client& session) {
    return send(session, record, nullptr, 0).then([](auto response) {
      return readAnswer(response.getCompletions()).asyncError;
    });
  });
}

CUresult RpcSink::synchronize(std::uint64_t context, ring::SynchronizeKind kind,
                              std::uint64_t handle, bool query) {
  ring::Synchronize command;
  command.sequence = nextSequence();
  command.context = context;
  command.kind = kind;
  command.handle = handle;
  command.completionToken = kToken;
  command.query = query;
  const std::vector<std::byte> record = encoded(ring::Command{command});
  bool deviceOutput = false;
  const CUresult result = runtime_.call([&](Session::Client& session) {
    return send(session, record, nullptr, 0).then([&](auto response) {
      const SubmitAnswer answer = readAnswer(response.getCompletions());
      deviceOutput = answer.deviceOutput;
      return answer.asyncError != CUDA_SUCCESS ? answer.asyncError : answer.tokenResult;
    });
  });
  if (deviceOutput) printDeviceOutput(runtime_);
  return result;
}

CUresult RpcSink::copyHostToDevice(const StreamTarget& target, CUdeviceptr destination,
                                   const void* source, std::size_t bytes, bool /*blocking*/) {
  const auto* from = static_cast<const kj::byte*>(source);
  for (std::size_t group = 0; group < bytes; group += kChunk * kChunksInFlight) {
    const std::size_t groupEnd = std::min(bytes, group + kChunk * kChunksInFlight);
    std::vector<std::vector<std::byte>> records;
    for (std::size_t offset = group; offset < groupEnd; offset += kChunk) {
      ring::CopyHostToDevice command;
      command.sequence = nextSequence();
      command.context = target.context;
      command.stream = target.stream;
      command.destination = destination + offset;
      command.source = ring::HostLocation{ring::HostRegion::kMessage, 0};
      command.bytes = std::min(kChunk, groupEnd - offset);
      records.push_back(encoded(ring::Command{command}));
    }
    // Each call returns once its bytes are in the daemon and the copy is queued (CUDA's
    // pageable semantics: the caller's buffer is free again).
    CUresult result = runtime_.call([&](Session::Client& session) {
      kj::Vector<kj::Promise<CUresult>> replies;
      std::size_t offset = group;
      for (const std::vector<std::byte>& record : records) {
        const std::size_t length = std::min(kChunk, groupEnd - offset);
        replies.add(send(session, record, kj::arrayPtr(from + offset, length), length)
                        .then([](auto response) {
                          return readAnswer(response.getCompletions()).asyncError;
                        }));
        offset += length;
      }
      return kj::joinPromises(replies.releaseAsArray()).then([](kj::Array<CUresult> results) {
        return firstFailure(results);
      });
    });
    if (result != CUDA_SUCCESS) return result;
  }
  return CUDA_SUCCESS;
}

CUresult RpcSink::copyDeviceToHost(const StreamTarget& target, void* destination,
                                   CUdeviceptr source, std::size_t bytes, bool /*blocking*/) {
  auto* to = static_cast<kj::byte*>(destination);
  // Written by the answers, on the loop thread while this thread waits in call().
  bool deviceOutput = false;
  const auto printOutput = [&]() {
    if (deviceOutput) printDeviceOutput(runtime_);
  };
  for (std::size_t group = 0; group < bytes; group += kChunk * kChunksInFlight) {
    const std::size_t groupEnd = std::min(bytes, group + kChunk * kChunksInFlight);
    std::vector<std::vector<std::byte>> records;
    for (std::size_t offset = group; offset < groupEnd; offset += kChunk) {
      ring::CopyDeviceToHost command;
      command.sequence = nextSequence();
      command.context = target.context;
      command.stream = target.stream;
      command.source = source + offset;
      command.destination = ring::HostLocation{ring::HostRegion::kMessage, 0};
      command.bytes = std::min(kChunk, groupEnd - offset);
      command.completionToken = kToken;
      records.push_back(encoded(ring::Command{command}));
    }
    CUresult result = runtime_.call([&](Session::Client& session) {
      kj::Vector<kj::Promise<CUresult>> replies;
      std::size_t offset = group;
      for (const std::vector<std::byte>& record : records) {
        const std::size_t length = std::min(kChunk, groupEnd - offset);
        // Runs on the loop thread while the calling thread waits, so writing into its buffer
        // here is safe.
        replies.add(
            send(session, record, nullptr, length).then([&, to, offset, length](auto response) {
              const SubmitAnswer answer = readAnswer(response.getCompletions());
              deviceOutput = deviceOutput || answer.deviceOutput;
              if (answer.asyncError != CUDA_SUCCESS) return answer.asyncError;
              if (answer.tokenResult != CUDA_SUCCESS) return answer.tokenResult;
              auto data = response.getPayload();
              if (data.size() != length) {
                GPUPROXY_STUB_LOG(kError,
                                  "cuMemcpyDtoH: gpuproxyd sent %zu bytes for %zu "
                                  "requested",
                                  data.size(), length);
                return CUDA_ERROR_UNKNOWN;
              }
              std::memcpy(to + offset, data.begin(), length);
              return CUDA_SUCCESS;
            }));
        offset += length;
      }
      return kj::joinPromises(replies.releaseAsArray()).then([](kj::Array<CUresult> results) {
        return firstFailure(results);
      });
    });
    if (result != CUDA_SUCCESS) {
      printOutput();
      return result;
    }
  }
  printOutput();
  return CUDA_SUCCESS;
}

}  // namespace gpuproxy::stub
