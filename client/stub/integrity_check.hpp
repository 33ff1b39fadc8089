#pragma once
// The answer to the CUDA runtime's integrity check (export table INTEGRITY_CHECK, slot 1).
//
// cudart (static and shared) asks the driver for a 128-bit value and compares it with its own
// computation over the same inputs; a driver that answers wrongly gets cudaErrorInvalidDevice-
// style failures from every runtime call. The value is an HMAC (RFC 2104) built on MD2
// (RFC 1319) with a fixed 16-byte key, over: the driver version, the runtime's version argument,
// the process and thread ids, the addresses of the CUDART_INTERFACE and INTEGRITY_CHECK tables
// and of the check function itself, the runtime's timestamp argument, then each device's UUID
// and PCI domain, bus and device numbers. Runtime versions ending in 0 or 1 expect a constant.
// Pure and header-only so that the unit tests can pin it down with known vectors.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace gpuproxy::stub {

// MD2 (RFC 1319): 16-byte blocks, a 48-byte state and a running checksum.
class Md2 {
public:
  void update(std::span<const std::uint8_t> bytes) {
    for (std::uint8_t byte : bytes) absorb(byte);
  }
  void update(const void* data, std::size_t size) {
    update(std::span(static_cast<const std::uint8_t*>(data), size));
  }

  std::array<std::uint8_t, 16> finish() {
    const std::uint8_t pad = static_cast<std::uint8_t>(16 - buffered_);
    for (std::uint8_t i = 0; i < pad; ++i) absorb(pad);
    const std::array<std::uint8_t, 16> checksum = checksum_;
    for (std::uint8_t byte : checksum) absorb(byte);
    std::array<std::uint8_t, 16> digest{};
    std::memcpy(digest.data(), state_.data(), digest.size());
    return digest;
  }

private:
  // RFC 1319's permutation of 0..255, built from the digits of pi.
  static constexpr std::array<std::uint8_t, 256> kPiSubstitution = {
      41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,
      243, 192, 199, 115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212,
      224, 22,  103, 66,  111, 24,  138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160,
      251, 245, 142, 187, 47,  238, 122, 169, 104, 121, 145, 21,  178, 7,   63,  148, 194, 16,  137,
      11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,  53,  62,  204, 231, 191, 247, 151,
      3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,  170, 198, 79,  184,
      56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,  100,
      113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246,
      28,  70,  97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249,
      206, 186, 197, 234, 38,  44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129,
      77,  82,  106, 220, 55,  200, 108, 193, 171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120,
      136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254, 59,  0,   29,  57,  242, 239, 183, 14,
      102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,  80,  180, 143, 237, 31,
      26,  219, 153, 141, 51,  159, 17,  131, 20};

  void absorb(std::uint8_t byte) {
    state_[16 + buffered_] = byte;
    state_[32 + buffered_] = static_cast<std::uint8_t>(state_[16 + buffered_] ^ state_[buffered_]);
    lastChecksum_ = checksum_[buffered_] ^= kPiSubstitution[byte ^ lastChecksum_];
    buffered_ = (buffered_ + 1) % 16;
    if (buffered_ == 0) compress();
  }

  void compress() {
    std::uint8_t t = 0;
    for (unsigned round = 0; round < 18; ++round) {
      for (std::uint8_t& x : state_) t = x ^= kPiSubstitution[t];
      t = static_cast<std::uint8_t>(t + round);
    }
  }

  std::array<std::uint8_t, 48> state_{};
  std::array<std::uint8_t, 16> checksum_{};
  std::uint8_t lastChecksum_ = 0;
  unsigned buffered_ = 0;
};

// What one device contributes to the hash, laid out as the runtime lays it out.
struct IntegrityDevice {
  std::array<std::uint8_t, 16> uuid{};
  std::int32_t pciDomain = 0;
  std::int32_t pciBus = 0;
  std::int32_t pciDevice = 0;
};
static_assert(sizeof(IntegrityDevice) == 28);

struct IntegrityInputs {
  std::uint32_t driverVersion = 0;   // what cuDriverGetVersion reports
  std::uint32_t runtimeVersion = 0;  // the runtime's first argument
  std::uint32_t processId = 0;
  std::uint32_t threadId = 0;  // pthread_self() of the calling thread, truncated
  const void* cudartTable = nullptr;
  const void* integrityTable = nullptr;
  const void* checkFunction = nullptr;
  std::uint64_t timestamp = 0;  // the runtime's second argument (seconds since the epoch)
};
static_assert(sizeof(IntegrityInputs) == 48 || sizeof(void*) != 8);

inline std::array<std::uint64_t, 2> integrityCheckAnswer(const IntegrityInputs& inputs,
                                                         std::span<const IntegrityDevice> devices) {
  switch (inputs.runtimeVersion % 10) {
    case 0:
      return {0x3341181C03CB675Cull, 0x8ED383AA1F4CD1E8ull};
    case 1:
      return {0x1841181C03CB675Cull, 0x8ED383AA1F4CD1E8ull};
    default:
      break;
  }
  static constexpr std::array<std::uint8_t, 16> kKey = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9,
                                                        0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36,
                                                        0x0B, 0xF5, 0x5A, 0x9F};
  auto keyed = [](std::uint8_t mask) {
    std::array<std::uint8_t, 16> pad{};
    for (std::size_t i = 0; i < pad.size(); ++i) pad[i] = kKey[i] ^ mask;
    return pad;
  };
  Md2 inner;
  inner.update(keyed(0x36));
  inner.update(&inputs, sizeof(inputs));
  for (const IntegrityDevice& device : devices) inner.update(&device, sizeof(device));
  const std::array<std::uint8_t, 16> innerDigest = inner.finish();

  Md2 outer;
  outer.update(keyed(0x5C));
  outer.update(innerDigest);
  const std::array<std::uint8_t, 16> digest = outer.finish();
  std::array<std::uint64_t, 2> answer{};
  std::memcpy(answer.data(), digest.data(), sizeof(answer));
  return answer;
}

}  // namespace gpuproxy::stub
