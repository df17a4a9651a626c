// Scratch memory of one kernel call, allocated by the calling thread before any output is
// written.
//
// Why here and not in the workers: an allocation that fails inside a parallel region, after
// other threads began writing `out`, would leave `out` half written; and worker scratch kept
// per pool thread for the life of the process is memory nobody can release. So a call sizes
// everything it needs first (a failure is then a clean std::bad_alloc -> MemoryError with
// nothing written), the kernels themselves never allocate, and the memory is bounded:
//
// Bound: each calling thread keeps at most kScratchKeepBytes of this scratch between calls
// (reused, so steady-state decode steps neither allocate nor page-fault); a call that needs
// more gets it for the duration of the call only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace llmk {

constexpr std::size_t kScratchKeepBytes = std::size_t{4} << 20;  // 4 MiB per calling thread

// A lease on `bytes` bytes of 64-byte aligned, uninitialised scratch: the calling thread's
// reusable buffer, or (when that one is already leased further up the stack) a buffer of its
// own. Throws std::bad_alloc. On destruction a buffer above kScratchKeepBytes is freed.
class ScratchLease {
 public:
  explicit ScratchLease(std::size_t bytes) {
    Slot& slot = thread_slot();
    if (!slot.leased) {
      if (slot.capacity < bytes) {
        slot.memory.reset();  // free first: never hold the old and the new buffer at once
        slot.capacity = 0;
        slot.memory = allocate(bytes);  // may throw: the slot stays free for the next lease
        slot.capacity = bytes;
      }
      slot.leased = true;  // only now: a constructor that throws runs no destructor
      shared_ = &slot;
      data_ = align(slot.memory.get());
    } else {
      own_ = allocate(bytes);
      data_ = align(own_.get());
    }
  }
  ~ScratchLease() {
    if (!shared_) return;
    if (shared_->capacity > kScratchKeepBytes) {
      shared_->memory.reset();
      shared_->capacity = 0;
    }
    shared_->leased = false;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  struct Slot {
    std::unique_ptr<unsigned char[]> memory;
    std::size_t capacity = 0;
    bool leased = false;
  };
  static Slot& thread_slot() {
    thread_local Slot slot;
    return slot;
  }
  static std::unique_ptr<unsigned char[]> allocate(std::size_t bytes) {
    if (bytes > SIZE_MAX - 64) throw std::bad_alloc();
    return std::unique_ptr<unsigned char[]>(new unsigned char[bytes + 64]);  // not zeroed
  }
  static void* align(unsigned char* p) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    return p + ((64 - a % 64) % 64);
  }

  Slot* shared_ = nullptr;
  std::unique_ptr<unsigned char[]> own_;
  void* data_ = nullptr;
};

}  // namespace llmk
