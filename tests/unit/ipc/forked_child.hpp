#pragma once
// A child process running a lambda, for tests that need two real address spaces. The child never
// returns into GoogleTest: it leaves with _exit(body()), and any exception is exit code 99.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

namespace gpuproxy::ipc::test {

class ForkedChild {
public:
  template <class Body>
  explicit ForkedChild(Body&& body) {
    std::fflush(nullptr);  // or buffered output would be written twice
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      int code = 99;
      try {
        code = body();
      } catch (const std::exception& error) {
        std::fprintf(stderr, "child: %s\n", error.what());
      }
      ::_exit(code);
    }
  }
  ~ForkedChild() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;

  pid_t pid() const { return pid_; }

  // The exit code, -signal when killed by one, or -1000 when it did not finish within `timeout`
  // (it is then killed), so a hung child fails the test instead of hanging it.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t result = ::waitpid(pid_, &status, WNOHANG);
      if (result == pid_) {
        reaped_ = true;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return -WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        reaped_ = true;
        return -1000;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void kill(int signal) { ::kill(pid_, signal); }

private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace gpuproxy::ipc::test
