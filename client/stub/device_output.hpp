#pragma once
// Device printf output (vprintf in kernels on the sim backend): the daemon keeps what the
// application's kernels printed, says so with a DeviceOutput completion record before answering a
// synchronising call, and the stub prints it on the application's stdout before that call
// returns, which is when and where a GPU's driver prints it.

namespace gpuproxy::stub {

class Runtime;

// Fetches the output the daemon holds for this process (Session.takeDeviceOutput) and writes it
// to stdout; logs what the daemon had to drop.
void printDeviceOutput(Runtime& runtime);

}  // namespace gpuproxy::stub
