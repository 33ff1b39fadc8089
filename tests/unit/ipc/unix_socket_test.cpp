// A listening socket leaves the file system as it found it: its file and the directories it had
// to create go with it, and nothing is touched when it cannot be opened.
#include "ipc/unix_socket.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace gpuproxy::ipc {
namespace {

class ListeningSocketTest : public ::testing::Test {
protected:
  ListeningSocketTest() {
    char pattern[] = "/tmp/gpx-sock-XXXXXX";
    root_ = ::mkdtemp(pattern);
  }
  ~ListeningSocketTest() override { std::filesystem::remove_all(root_); }

  static bool exists(const std::string& path) {
    struct stat info {};
    return ::lstat(path.c_str(), &info) == 0;
  }

  std::string root_;
};

TEST_F(ListeningSocketTest, WithdrawingRemovesTheSocketAndTheDirectoriesItMade) {
  const std::string path = root_ + "/a/b/gpuproxy.sock";
  {
    ListeningSocket socket = ListeningSocket::open(path, 0666);
    EXPECT_GE(socket.fd(), 0);
    struct stat info {};
    ASSERT_EQ(::stat(path.c_str(), &info), 0);
    EXPECT_TRUE(S_ISSOCK(info.st_mode));
    EXPECT_EQ(info.st_mode & 0777, 0666u);
  }
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(root_ + "/a"));
  EXPECT_TRUE(exists(root_));
}

TEST_F(ListeningSocketTest, DirectoriesThatWereThereOrFilledSinceStay) {
  std::filesystem::create_directories(root_ + "/kept");
  ListeningSocket socket = ListeningSocket::open(root_ + "/kept/new/gpuproxy.sock", 0600);
  std::ofstream(root_ + "/kept/new/someone-elses") << "x";
  socket.withdraw();
  EXPECT_TRUE(exists(root_ + "/kept/new/someone-elses"));
  EXPECT_FALSE(exists(root_ + "/kept/new/gpuproxy.sock"));
}

TEST_F(ListeningSocketTest, AFailedOpenLeavesNothingAndTouchesNoOneElsesSocket) {
  const std::string path = root_ + "/taken/gpuproxy.sock";
  ListeningSocket first = ListeningSocket::open(path, 0666);
  EXPECT_THROW(ListeningSocket::open(path, 0666), std::runtime_error);
  EXPECT_TRUE(exists(path));  // still the first one's

  std::ofstream(root_ + "/file") << "x";
  EXPECT_THROW(ListeningSocket::open(root_ + "/file/sub/gpuproxy.sock", 0666), std::runtime_error);
  EXPECT_THROW(ListeningSocket::open(root_ + "/new/" + std::string(200, 'x'), 0666),
               std::runtime_error);
  EXPECT_FALSE(exists(root_ + "/new"));
}

TEST_F(ListeningSocketTest, MovingKeepsOneOwner) {
  const std::string path = root_ + "/moved/gpuproxy.sock";
  ListeningSocket socket = ListeningSocket::open(path, 0666);
  ListeningSocket moved = std::move(socket);
  socket.withdraw();  // the moved-from socket owns nothing
  EXPECT_TRUE(exists(path));
  moved.withdraw();
  EXPECT_FALSE(exists(root_ + "/moved"));
}

}  // namespace
}  // namespace gpuproxy::ipc
