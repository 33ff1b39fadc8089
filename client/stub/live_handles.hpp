#pragma once
// Objects the stub makes itself and hands to the application as opaque handles (graphs, executable
// graphs, link states): a handle is followed only while it names one that is still alive, so that
// a made-up, freed or wrong-kind handle is refused instead of dereferenced. The objects themselves
// are the application's to serialise, as CUDA's are; the table only guards its own set. Tables are
// leaked on purpose, as the stub's other tables (applications call CUDA from static destructors).

#include <map>
#include <memory>
#include <mutex>
#include <set>

namespace gpuproxy::stub {

template <typename Object>
class LiveHandles {
public:
  // Takes `object` over; the pointer is its handle (the same as before for one it held lent).
  Object* adopt(std::unique_ptr<Object> object) {
    std::lock_guard lock(mutex_);
    pinned_.erase(object.get());
    live_.insert(object.get());
    return object.release();
  }
  // Null unless `handle` names a live object.
  Object* find(const void* handle) const {
    auto* object = static_cast<Object*>(const_cast<void*>(handle));
    std::lock_guard lock(mutex_);
    return live_.count(object) != 0 ? object : nullptr;
  }
  // Destroys the object `handle` names; false if it names none, or one that is pinned (lent, or
  // held while something else writes into it).
  bool destroy(const void* handle) {
    auto* object = static_cast<Object*>(const_cast<void*>(handle));
    {
      std::lock_guard lock(mutex_);
      if (pinned_.count(object) != 0 || live_.erase(object) == 0) return false;
    }
    delete object;
    return true;
  }
  // An object owned elsewhere (a conditional node's body graph, a capture's graph) that handles
  // may name until forget(); the table never destroys it.
  void lend(Object* object) {
    std::lock_guard lock(mutex_);
    live_.insert(object);
    ++pinned_[object];
  }
  void forget(const Object* object) {
    std::lock_guard lock(mutex_);
    live_.erase(const_cast<Object*>(object));
    pinned_.erase(const_cast<Object*>(object));
  }
  // Keeps a live object from being destroyed until release(); false if it is not live.
  bool hold(const Object* object) {
    std::lock_guard lock(mutex_);
    auto* held = const_cast<Object*>(object);
    if (live_.count(held) == 0) return false;
    ++pinned_[held];
    return true;
  }
  void release(const Object* object) {
    std::lock_guard lock(mutex_);
    auto found = pinned_.find(const_cast<Object*>(object));
    if (found != pinned_.end() && --found->second == 0) pinned_.erase(found);
  }
  // Whether destroy() would refuse `object` for a pin (lent, or held).
  bool pinned(const Object* object) const {
    std::lock_guard lock(mutex_);
    return pinned_.count(const_cast<Object*>(object)) != 0;
  }
  // Runs `visit(set of live objects)` with the table locked, so that none is added or destroyed
  // meanwhile (a walk over every object).
  template <typename Visit>
  decltype(auto) locked(Visit&& visit) const {
    std::lock_guard lock(mutex_);
    return visit(live_);
  }

private:
  mutable std::mutex mutex_;
  std::set<Object*> live_;
  std::map<Object*, int> pinned_;  // objects destroy() refuses, with how many pins each has
};

}  // namespace gpuproxy::stub
