// Without libFuzzer: runs each file under the given directories (or each given file) through
// LLVMFuzzerTestOneInput once, so the seed corpus is a regression test on every build.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

void runFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  // A fresh allocation of exactly the file's size, so that ASan builds catch reads past the end.
  std::vector<std::uint8_t> input(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(input.empty() ? nullptr : input.data(), input.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " corpus-dir-or-file...\n";
    return 2;
  }
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path path(argv[i]);
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
        if (!entry.is_regular_file()) continue;
        runFile(entry.path());
        ++files;
      }
    } else if (std::filesystem::is_regular_file(path)) {
      runFile(path);
      ++files;
    } else {
      std::cerr << path << ": not found\n";
      return 1;
    }
  }
  if (files == 0) {
    std::cerr << "no corpus files found\n";
    return 1;
  }
  std::cout << "replayed " << files << " inputs\n";
  return 0;
}
