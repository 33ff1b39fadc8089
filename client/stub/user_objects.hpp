#pragma once
// CUDA user objects (cuUserObjectCreate, cuUserObjectRetain/Release, cuGraphRetainUserObject,
// cuGraphReleaseUserObject): a reference-counted pointer whose destructor callback runs once the
// last reference is gone, so that resources a graph's work uses live as long as the graph, or the
// executable graphs made from it, may still run. Kept entirely in the stub, as graphs are.
//
// Destructors run on a thread of the stub's own, one after the other, never on the thread that
// dropped the last reference (CUDA runs them on a shared internal thread; they must not call
// CUDA). References held by a graph are UserObjectReferences: copying a graph (instantiating it,
// cloning it, making it a child graph) takes references of its own, and destroying it drops them.
// Thread-safe.

#include <cuda.h>

#include <cstdint>
#include <map>

namespace gpuproxy::stub {

struct UserObject;

// CUDA_ERROR_INVALID_VALUE for a null destructor, a zero count, or flags other than
// CU_USER_OBJECT_NO_DESTRUCTOR_SYNC (which CUDA requires).
CUresult createUserObject(void* pointer, CUhostFn destroy, unsigned initialCount, unsigned flags,
                          UserObject*& made);
// The live user object `handle` names, or null.
UserObject* findUserObject(const void* handle);
// Takes `count` more references (the caller's). False for a count of 0 or above INT_MAX.
bool retainUserObject(UserObject& object, unsigned count);
// Drops `count` references; the last one queues the destructor and ends the handle. False for a
// count of 0 or above INT_MAX.
bool releaseUserObject(UserObject& object, unsigned count);

// The user object references one graph owns.
class UserObjectReferences {
public:
  UserObjectReferences() = default;
  UserObjectReferences(const UserObjectReferences& other);
  UserObjectReferences& operator=(const UserObjectReferences& other);
  UserObjectReferences(UserObjectReferences&& other) noexcept;
  UserObjectReferences& operator=(UserObjectReferences&& other) noexcept;
  ~UserObjectReferences();

  // cuGraphRetainUserObject: `count` references, new ones or (`moved`) the caller's. False (and
  // nothing taken) for a count of 0 or above INT_MAX.
  bool add(UserObject& object, unsigned count, bool moved);
  // cuGraphReleaseUserObject: false (and nothing released) for such a count, or when the graph
  // holds fewer.
  bool remove(UserObject& object, unsigned count);
  bool empty() const { return held_.empty(); }

private:
  void releaseAll();
  std::map<UserObject*, unsigned long long> held_;
};

}  // namespace gpuproxy::stub
