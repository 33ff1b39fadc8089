// Fatbins handed to cuModuleLoadData through the stub: every shape nvcc 13 writes loads on the sim
// from its PTX (uncompressed, zstd, LZ4, several architectures, arch-specific PTX beside generic,
// LTO entries beside PTX) and runs; machine code alone, a fatbin whose header cuts an entry short
// and a compressed entry that lies about its size are each a CUDA error and a log line, and the
// daemon serves the next client as before. The images are nvcc's (tests/data/fatbin/README.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

const std::string kData = GPUPROXY_FATBIN_TEST_DATA;

std::vector<char> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string writeFile(const TempDir& directory, const std::string& name,
                      const std::vector<char>& bytes) {
  const std::string path = directory.file(name);
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(FatbinImages, EveryShapeNvccWritesRunsFromItsPtx) {
  Daemon daemon;
  for (const char* image :
       {"nocompress_sm75.fatbin", "default_sm75.fatbin", "compress_all.fatbin", "lz4_all.fatbin",
        "ptx_lz4.fatbin", "multi_ptx_zstd.fatbin", "ptx_90a_and_90.fatbin", "lto_and_ptx.fatbin"}) {
    RunResult result = daemon.runClient("error_probe", {"load-image", kData + "/" + image});
    EXPECT_TRUE(result.status.exitedWith(0)) << image << result.errors;
    EXPECT_NE(result.output.find("cuModuleLoadData CUDA_SUCCESS"), std::string::npos)
        << image << "\n"
        << result.output << daemon.log();
    EXPECT_NE(result.output.find("scale-result OK"), std::string::npos) << image << "\n"
                                                                        << result.output;
  }
}

// As cuBLAS ships: machine code for every GPU it supports, PTX for the newest only. A GPU of the
// sim's kind (9.0) runs the machine code; the sim runs the newer PTX instead, and says so. The
// kernel's PTX and binary versions are what the GPU running that machine code reports (cuBLAS
// picks its launch configurations by them).
TEST(FatbinImages, MachineCodeForTheSimsGpuAndNewerPtxRunsFromThatPtx) {
  Daemon daemon;
  RunResult result =
      daemon.runClient("error_probe", {"load-image", kData + "/sass90_ptx100.fatbin"});
  EXPECT_NE(result.output.find("scale-result OK"), std::string::npos)
      << result.output << daemon.log();
  EXPECT_NE(result.output.find("scale-versions ptx 90 binary 90"), std::string::npos)
      << result.output;
  // The sim's own account (through the chain, the upstream sim daemon's log has it).
  if (chainedCudaBackend()) return;
  EXPECT_NE(daemon.log().find("has machine code for sm_90 but no PTX for it; running its "
                              "compute_100 PTX"),
            std::string::npos)
      << daemon.log();
}

TEST(FatbinImages, MachineCodeAloneIsNoBinaryForGpuWithTheArchitecturesLogged) {
  Daemon daemon;
  RunResult result =
      daemon.runClient("error_probe", {"load-image", kData + "/sass_only_compressed.fatbin"});
  EXPECT_NE(result.output.find("cuModuleLoadData CUDA_ERROR_NO_BINARY_FOR_GPU"), std::string::npos)
      << result.output;
  if (chainedCudaBackend()) return;  // the sim's account, in the upstream daemon's log
  EXPECT_NE(daemon.log().find("no PTX entry for sm_90; the fatbin holds: sm_75 (ELF), sm_80 (ELF)"),
            std::string::npos)
      << daemon.log();
}

TEST(FatbinImages, ImagesThatLieAreInvalidAndTheDaemonCarriesOn) {
  Daemon daemon;
  TempDir directory;
  const std::vector<char> original = readFile(kData + "/default_sm75.fatbin");
  ASSERT_GT(original.size(), 200u);

  // The header's size of the entries cut to half: the last entry runs past the fatbin's end.
  std::vector<char> cut = original;
  std::uint64_t entriesBytes = 0;
  std::memcpy(&entriesBytes, cut.data() + 8, sizeof(entriesBytes));
  entriesBytes /= 2;
  std::memcpy(cut.data() + 8, &entriesBytes, sizeof(entriesBytes));

  // The compressed PTX entry (the second) claims twice the bytes its frame holds.
  std::vector<char> lying = original;
  std::uint32_t firstHeader = 0;
  std::uint64_t firstPayload = 0;
  std::memcpy(&firstHeader, lying.data() + 16 + 4, sizeof(firstHeader));
  std::memcpy(&firstPayload, lying.data() + 16 + 8, sizeof(firstPayload));
  const std::size_t ptxEntry = 16 + firstHeader + firstPayload;
  std::uint16_t kind = 0;
  std::memcpy(&kind, lying.data() + ptxEntry, sizeof(kind));
  ASSERT_EQ(kind, 1) << "the sample's second entry is its PTX";
  std::uint64_t declared = 0;
  std::memcpy(&declared, lying.data() + ptxEntry + 56, sizeof(declared));
  declared *= 2;
  std::memcpy(lying.data() + ptxEntry + 56, &declared, sizeof(declared));

  for (const auto& [name, bytes] :
       {std::pair{"cut.fatbin", cut}, std::pair{"lying.fatbin", lying}}) {
    RunResult result =
        daemon.runClient("error_probe", {"load-image", writeFile(directory, name, bytes)});
    EXPECT_NE(result.output.find("cuModuleLoadData CUDA_ERROR_INVALID_IMAGE"), std::string::npos)
        << name << "\n"
        << result.output << daemon.log();
  }
  if (!chainedCudaBackend()) {  // the sim's account, in the upstream daemon's log
    EXPECT_NE(daemon.log().find("malformed fatbin"), std::string::npos) << daemon.log();
    EXPECT_NE(daemon.log().find("cannot load a fatbin"), std::string::npos) << daemon.log();
  }

  RunResult after = daemon.runClient("vector_add", {"--elements", "4096"});
  EXPECT_TRUE(after.status.exitedWith(0)) << after.errors << daemon.log();
  EXPECT_TRUE(eventually([&] { return daemon.status()["devices"][0]["memory_used"] == 0; }));
}

}  // namespace
}  // namespace gpuproxy::testing
