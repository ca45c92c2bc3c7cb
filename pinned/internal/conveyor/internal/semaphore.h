// conveyor/internal/semaphore.h: the counting semaphore that goes with each lock-free index queue.
//
// Machinery, not a public header: it lives in pinned/internal/, which is on the build's include
// path only and is not installed, so no public header may include it. The slot ring (pinned.cpp)
// and the loader's engine use it.
//
// What it is for: a stage pushes an index (a slot, a job) into a Boost.Lockfree queue and then
// releases one permit; the next stage acquires a permit and then pops, so a permit always stands
// for a queued index. Waiting is only for a thread with nothing to do.
//
// Why not std::counting_semaphore: libstdc++ 12's implementation spins with sched_yield() before
// it sleeps, and try_acquire() on an empty count spins the same way. On a machine with no spare
// core, each yield hands the CPU to a busy worker for a whole time slice, so the consumer that
// dispatches and collects batches ran only when a worker blocked: measured with a memcpy dataset
// on 2 cores, one of two workers sat idle and the pipeline moved 0.64 of a plain memcpy.
//
// Guarantees: this is a POSIX semaphore (glibc: an atomic fast path, futex sleep), never yields.
//   * try_acquire() never waits and never yields.
//   * acquire() spins briefly (200 pause instructions: a few to about ten microseconds), then
//     sleeps until a permit comes; try_acquire_for() gives up after the duration (steady clock;
//     durations beyond a year count as a year).
//   * release() never blocks; it wakes a sleeping waiter if there is one.
// Requires: the count stays below SEM_VALUE_MAX (INT_MAX on Linux).
// Thread safety: every member function may be called concurrently, except construction and
// destruction.
#pragma once

#include <semaphore.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <exception>
#include <system_error>

namespace conveyor {

class Semaphore {
 public:
  explicit Semaphore(unsigned initial = 0) {
    if (sem_init(&sem_, 0, initial) != 0) {
      throw std::system_error(errno, std::generic_category(), "conveyor: sem_init");
    }
  }
  ~Semaphore() { sem_destroy(&sem_); }
  Semaphore(const Semaphore&) = delete;
  Semaphore& operator=(const Semaphore&) = delete;

  void release(std::ptrdiff_t permits = 1) noexcept {
    for (; permits > 0; --permits) {
      if (sem_post(&sem_) != 0) std::terminate();  // overflow: a bookkeeping bug, not input
    }
  }

  void acquire() noexcept {
    // A short spin first: a permit often comes within microseconds (a worker finishing a small
    // batch), and sleeping and waking cost more than that. No yield, so the spin never gives the
    // CPU away for a time slice.
    for (int i = 0; i < kSpins; ++i) {
      if (try_acquire()) return;
      pause();
    }
    while (sem_wait(&sem_) != 0) {
      if (errno != EINTR) std::terminate();  // EINVAL: not a semaphore, a bug
    }
  }

  bool try_acquire() noexcept {
    while (sem_trywait(&sem_) != 0) {
      if (errno != EINTR) return false;  // EAGAIN: no permit now
    }
    return true;
  }

  template <typename Rep, typename Period>
  bool try_acquire_for(std::chrono::duration<Rep, Period> timeout) noexcept {
    if (try_acquire()) return true;
    timespec deadline{};
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    constexpr std::chrono::hours kYear{24 * 365};
    const auto ns = timeout >= kYear
                        ? std::chrono::duration_cast<std::chrono::nanoseconds>(kYear).count()
                        : std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    if (ns <= 0) return false;
    deadline.tv_sec += static_cast<time_t>(ns / 1'000'000'000);
    deadline.tv_nsec += static_cast<long>(ns % 1'000'000'000);
    if (deadline.tv_nsec >= 1'000'000'000) {
      deadline.tv_sec += 1;
      deadline.tv_nsec -= 1'000'000'000;
    }
    while (sem_clockwait(&sem_, CLOCK_MONOTONIC, &deadline) != 0) {
      if (errno != EINTR) return false;  // ETIMEDOUT
    }
    return true;
  }

 private:
  static constexpr int kSpins = 200;
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  sem_t sem_;
};

}  // namespace conveyor
