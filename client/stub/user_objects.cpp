#include "client/stub/user_objects.hpp"

#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "client/stub/live_handles.hpp"

namespace gpuproxy::stub {

struct UserObject {
  void* pointer = nullptr;
  CUhostFn destroy = nullptr;
  std::mutex mutex;
  unsigned long long references = 0;  // guarded by mutex
};

namespace {

LiveHandles<UserObject>& userObjects() {
  static auto* table = new LiveHandles<UserObject>;  // leaked, as the stub's other tables
  return *table;
}

// The thread destructors run on, started with the first one queued; it lives as long as the
// process, as the stub's other threads do.
class DestructorThread {
public:
  static DestructorThread& instance() {
    static auto* thread = new DestructorThread;
    return *thread;
  }

  void queue(CUhostFn destroy, void* pointer) {
    std::lock_guard lock(mutex_);
    pending_.emplace_back(destroy, pointer);
    if (!started_) {
      started_ = true;
      std::thread([this] { run(); }).detach();
    }
    queued_.notify_one();
  }

private:
  void run() {
    for (;;) {
      std::pair<CUhostFn, void*> next;
      {
        std::unique_lock lock(mutex_);
        queued_.wait(lock, [&] { return !pending_.empty(); });
        next = pending_.front();
        pending_.pop_front();
      }
      next.first(next.second);
    }
  }

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::pair<CUhostFn, void*>> pending_;
  bool started_ = false;
};

bool validCount(unsigned count) {
  return count != 0 && count <= static_cast<unsigned>(INT_MAX);
}

}  // namespace

CUresult createUserObject(void* pointer, CUhostFn destroy, unsigned initialCount, unsigned flags,
                          UserObject*& made) {
  if (destroy == nullptr || !validCount(initialCount) ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto object = std::make_unique<UserObject>();
  object->pointer = pointer;
  object->destroy = destroy;
  object->references = initialCount;
  made = userObjects().adopt(std::move(object));
  return CUDA_SUCCESS;
}

UserObject* findUserObject(const void* handle) {
  return userObjects().find(handle);
}

namespace {

void addReferences(UserObject& object, unsigned long long count) {
  std::lock_guard lock(object.mutex);
  object.references += count;
}

// The last reference gone queues the destructor and ends the handle.
void dropReferences(UserObject& object, unsigned long long count) {
  {
    std::lock_guard lock(object.mutex);
    // Releasing references nobody holds is undefined in CUDA; here it ends the object.
    object.references -= std::min(count, object.references);
    if (object.references != 0) return;
  }
  DestructorThread::instance().queue(object.destroy, object.pointer);
  userObjects().destroy(&object);
}

}  // namespace

bool retainUserObject(UserObject& object, unsigned count) {
  if (!validCount(count)) return false;
  addReferences(object, count);
  return true;
}

bool releaseUserObject(UserObject& object, unsigned count) {
  if (!validCount(count)) return false;
  dropReferences(object, count);
  return true;
}

UserObjectReferences::UserObjectReferences(const UserObjectReferences& other) : held_(other.held_) {
  for (const auto& [object, count] : held_) addReferences(*object, count);
}

UserObjectReferences& UserObjectReferences::operator=(const UserObjectReferences& other) {
  if (this != &other) {
    UserObjectReferences copy(other);
    *this = std::move(copy);
  }
  return *this;
}

UserObjectReferences::UserObjectReferences(UserObjectReferences&& other) noexcept
    : held_(std::exchange(other.held_, {})) {}

UserObjectReferences& UserObjectReferences::operator=(UserObjectReferences&& other) noexcept {
  if (this != &other) {
    releaseAll();
    held_ = std::exchange(other.held_, {});
  }
  return *this;
}

UserObjectReferences::~UserObjectReferences() {
  releaseAll();
}

bool UserObjectReferences::add(UserObject& object, unsigned count, bool moved) {
  if (!validCount(count)) return false;
  if (!moved) addReferences(object, count);
  held_[&object] += count;
  return true;
}

bool UserObjectReferences::remove(UserObject& object, unsigned count) {
  auto found = held_.find(&object);
  if (!validCount(count) || found == held_.end() || found->second < count) return false;
  found->second -= count;
  if (found->second == 0) held_.erase(found);
  dropReferences(object, count);
  return true;
}

void UserObjectReferences::releaseAll() {
  for (const auto& [object, count] : std::exchange(held_, {})) dropReferences(*object, count);
}

}  // namespace gpuproxy::stub
