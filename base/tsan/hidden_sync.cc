// ThreadSanitizer builds only (KVL_SANITIZE=thread links this file into every
// binary, exported with -rdynamic). Debian's libabsl and libgrpc are not
// instrumented, so TSan cannot see how they order the threads that use them.
// gRPC hands our reactors, callbacks and its own header-inlined call state
// (grpcpp, compiled into our binaries and instrumented) from one thread to
// another; without this file every such hand-off is reported as a race.
//
// The functions below define entry points that gRPC and Abseil call through
// the PLT (the dynamic linker resolves those calls to the executable's
// definitions first). Each forwards to the library's own definition, found
// with dlsym(RTLD_NEXT), and tells TSan what the call means:
// - absl::Mutex (gpr_mu and grpc_core::Mutex wrap it): taking a lock acquires
//   the mutex's happens-before state, releasing one releases it, a condition
//   variable wait releases then reacquires, Notify releases and a successful
//   wait acquires.
// - gRPC's completion tags: starting a batch (or requesting a call) with a
//   tag releases the tag; the completion of that tag (grpc_cq_end_op, which
//   every completion passes through before its callback runs or a
//   completion-queue reader gets it) acquires and releases it; a reader that
//   gets the tag from grpc_completion_queue_next/pluck acquires it. gRPC
//   passes the completion between those points with lock-free queues TSan
//   cannot see either.
// This adds the synchronisation those calls really provide and nothing more,
// so it hides no race in our code. (An instrumented Abseil would also report
// lock-order inversions in its locks; this cannot.)
//
// Left out, because nothing in our binaries or in gRPC 1.51 calls them:
// Mutex::LockWhen / Await (and their timed forms), which Abseil runs through
// private entry points, and Notification::HasBeenNotified (inline).

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpc/grpc.h"

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}

namespace {

#define KVL_TSAN_STR2(x) #x
#define KVL_TSAN_STR(x) KVL_TSAN_STR2(x)

// The library's definition of the function with mangled (or C) name `name`:
// the next one after this executable's. Aborts when it is missing: running on
// without the library's lock or call would be wrong.
void* RealC(const std::string& name) {
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "base/tsan/hidden_sync.cc: %s not found\n", name.c_str());
    std::abort();
  }
  return fn;
}

#if !defined(ABSL_OPTION_USE_INLINE_NAMESPACE) || !ABSL_OPTION_USE_INLINE_NAMESPACE
#error "the mangled names below assume Abseil's inline namespace (Debian's build has one)"
#endif

// Abseil's inline namespace as a mangled name's component: length, then name.
std::string AbslNamespace() {
  const std::string ns = KVL_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::to_string(ns.size()) + ns;
}

// Abseil's member function whose mangled name is "_ZN4absl" (or "_ZNK4absl"
// for a const member), Abseil's inline namespace, then `rest` (written
// against nm -D of Debian's libabsl, where S0_ stands for absl::<namespace>).
void* RealAbsl(bool const_member, const char* rest) {
  return RealC(std::string(const_member ? "_ZNK4absl" : "_ZN4absl") + AbslNamespace() + rest);
}

// KVL_TSAN_HIDDEN_SYNC=0 turns the annotations off (the calls still go to the
// libraries), for measuring what they change (experiments/tsan_whole_suite/).
bool Enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("KVL_TSAN_HIDDEN_SYNC");
    return value == nullptr || std::string(value) != "0";
  }();
  return enabled;
}

void Acquire(void* addr) {
  if (Enabled()) __tsan_acquire(addr);
}

void Release(void* addr) {
  if (Enabled()) __tsan_release(addr);
}

template <typename Fn>
Fn Real(const char* rest) {
  return reinterpret_cast<Fn>(RealAbsl(false, rest));
}

template <typename Fn>
Fn RealConst(const char* rest) {
  return reinterpret_cast<Fn>(RealAbsl(true, rest));
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Release(this);
  real(this);
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void CondVar::Wait(Mutex* mu) {
  static const auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  Release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      RealConst<void (*)(const Notification*)>("12Notification19WaitForNotificationEv");
  real(this);
  Acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const auto real = RealConst<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) Acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const auto real = RealConst<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) Acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl

// gRPC's completion tags.

struct grpc_cq_completion;

extern "C" grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops,
                                                 void* tag, void* reserved) {
  using Fn = grpc_call_error (*)(grpc_call*, const grpc_op*, size_t, void*, void*);
  static const auto real = reinterpret_cast<Fn>(RealC("grpc_call_start_batch"));
  Release(tag);
  return real(call, ops, nops, tag, reserved);
}

extern "C" grpc_call_error grpc_server_request_call(grpc_server* server, grpc_call** call,
                                                    grpc_call_details* details,
                                                    grpc_metadata_array* request_metadata,
                                                    grpc_completion_queue* cq_bound_to_call,
                                                    grpc_completion_queue* cq_for_notification,
                                                    void* tag_new) {
  using Fn = grpc_call_error (*)(grpc_server*, grpc_call**, grpc_call_details*,
                                 grpc_metadata_array*, grpc_completion_queue*,
                                 grpc_completion_queue*, void*);
  static const auto real = reinterpret_cast<Fn>(RealC("grpc_server_request_call"));
  Release(tag_new);
  return real(server, call, details, request_metadata, cq_bound_to_call, cq_for_notification,
              tag_new);
}

extern "C" grpc_call_error grpc_server_request_registered_call(
    grpc_server* server, void* registered_method, grpc_call** call, gpr_timespec* deadline,
    grpc_metadata_array* request_metadata, grpc_byte_buffer** optional_payload,
    grpc_completion_queue* cq_bound_to_call, grpc_completion_queue* cq_for_notification,
    void* tag_new) {
  using Fn = grpc_call_error (*)(grpc_server*, void*, grpc_call**, gpr_timespec*,
                                 grpc_metadata_array*, grpc_byte_buffer**,
                                 grpc_completion_queue*, grpc_completion_queue*, void*);
  static const auto real = reinterpret_cast<Fn>(RealC("grpc_server_request_registered_call"));
  Release(tag_new);
  return real(server, registered_method, call, deadline, request_metadata, optional_payload,
              cq_bound_to_call, cq_for_notification, tag_new);
}

// gRPC's internal completion (src/core/lib/surface/completion_queue.h; a C++
// symbol, exported and called through the PLT by libgrpc itself).
void grpc_cq_end_op(grpc_completion_queue* cq, void* tag, absl::Status error,
                    void (*done)(void* done_arg, grpc_cq_completion* storage), void* done_arg,
                    grpc_cq_completion* storage, bool internal) {
  using Fn = void (*)(grpc_completion_queue*, void*, absl::Status,
                      void (*)(void*, grpc_cq_completion*), void*, grpc_cq_completion*, bool);
  static const auto real = reinterpret_cast<Fn>(
      RealC("_Z14grpc_cq_end_opP21grpc_completion_queuePvN4absl" + AbslNamespace() +
            "6StatusEPFvS1_P18grpc_cq_completionES1_S6_b"));
  Acquire(tag);
  Release(tag);
  real(cq, tag, std::move(error), done, done_arg, storage, internal);
}

extern "C" grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                                 void* reserved) {
  using Fn = grpc_event (*)(grpc_completion_queue*, gpr_timespec, void*);
  static const auto real = reinterpret_cast<Fn>(RealC("grpc_completion_queue_next"));
  const grpc_event event = real(cq, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) Acquire(event.tag);
  return event;
}

extern "C" grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag,
                                                  gpr_timespec deadline, void* reserved) {
  using Fn = grpc_event (*)(grpc_completion_queue*, void*, gpr_timespec, void*);
  static const auto real = reinterpret_cast<Fn>(RealC("grpc_completion_queue_pluck"));
  const grpc_event event = real(cq, tag, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) Acquire(event.tag);
  return event;
}
