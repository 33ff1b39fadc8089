// The stub's exported surface is exactly the generated list of cuda.h functions: everything an
// application may dlsym is there, and nothing else (no C++ symbols, no helpers) leaks out.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string envOrEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::set<std::string> readSymbolList() {
  std::filesystem::path path = std::filesystem::path(envOrEmpty("GPUPROXY_BUILD_DIR")) / "client" /
                               "stub" / "generated" / "cuda_api_symbols.txt";
  std::ifstream in(path);
  std::set<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') names.insert(line);
  }
  return names;
}

class ExportTableTest : public ::testing::Test {
protected:
  void SetUp() override {
    stubPath_ = envOrEmpty("GPUPROXY_STUB");
    ASSERT_FALSE(stubPath_.empty()) << "GPUPROXY_STUB not set";
    ASSERT_FALSE(envOrEmpty("GPUPROXY_BUILD_DIR").empty()) << "GPUPROXY_BUILD_DIR not set";
    symbols_ = readSymbolList();
    handle_ = dlopen(stubPath_.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
  }
  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }

  std::string stubPath_;
  std::set<std::string> symbols_;
  void* handle_ = nullptr;
};

TEST_F(ExportTableTest, SymbolListCoversTheDriverApi) {
  // cuda.h (CUDA 12/13) declares about 635 functions; an empty or truncated list must fail.
  EXPECT_GT(symbols_.size(), 600u);
  for (const char* name : {"cuInit", "cuMemAlloc", "cuMemAlloc_v2", "cuCtxCreate_v4",
                           "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuMemcpyHtoD_v2_ptds",
                           "cuGetProcAddress", "cuGetProcAddress_v2", "cuGraphCreate"}) {
    EXPECT_EQ(symbols_.count(name), 1u) << name;
  }
  EXPECT_EQ(symbols_.count("cuGetProcAddress_v2_ptsz"), 0u) << "static inline in cuda.h";
}

TEST_F(ExportTableTest, EveryListedSymbolResolvesInsideTheStub) {
  ASSERT_FALSE(symbols_.empty());
  std::string stubReal = std::filesystem::canonical(stubPath_);
  for (const std::string& name : symbols_) {
    void* address = dlsym(handle_, name.c_str());
    ASSERT_NE(address, nullptr) << name << ": " << dlerror();
    Dl_info info{};
    ASSERT_NE(dladdr(address, &info), 0) << name;
    EXPECT_EQ(std::filesystem::canonical(info.dli_fname).string(), stubReal) << name;
  }
}

TEST_F(ExportTableTest, NothingElseIsExported) {
  std::string command = "nm -D --defined-only '" + stubPath_ + "'";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  ASSERT_NE(pipe, nullptr);
  std::set<std::string> exported;
  std::array<char, 512> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe.get()) != nullptr) {
    std::istringstream line(buffer.data());
    std::string address, type, name;
    if (!(line >> address >> type >> name)) continue;
    EXPECT_NE(name.rfind("_Z", 0), 0u) << "C++ symbol exported: " << name;
    exported.insert(name);
  }
  int status = pclose(pipe.release());
  ASSERT_EQ(status, 0) << command;
  EXPECT_GT(exported.size(), 600u);
  for (const std::string& name : exported) {
    EXPECT_EQ(symbols_.count(name), 1u) << "exported but not declared by cuda.h: " << name;
  }
  for (const std::string& name : symbols_) {
    EXPECT_EQ(exported.count(name), 1u) << "declared by cuda.h but not exported: " << name;
  }
}

}  // namespace
