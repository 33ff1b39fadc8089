#include "client/stub/device_output.hpp"

#include <cstdio>

#include "client/stub/log.hpp"
#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

void printDeviceOutput(Runtime& runtime) {
  std::string text;
  std::uint64_t lost = 0;
  try {
    runtime.call([&](protocol::Session::Client& session) {
      return session.takeDeviceOutputRequest().send().then([&](auto response) {
        const auto data = response.getText();
        text.assign(reinterpret_cast<const char*>(data.begin()), data.size());
        lost = response.getLostBytes();
      });
    });
  } catch (const kj::Exception& exception) {
    runtime.failed("device printf", exception);
    return;
  }
  if (lost > 0) {
    GPUPROXY_STUB_LOG(kWarn,
                      "%llu bytes of device printf output were lost: the kernels printed more "
                      "than the 1 MiB a GPU's printf buffer holds between synchronisations",
                      static_cast<unsigned long long>(lost));
  }
  // Through the application's own stdout stream, so that it lands in order with what the
  // application printed itself.
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace gpuproxy::stub
