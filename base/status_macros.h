// Status propagation: KVL_RETURN_IF_ERROR(expr) returns expr's absl::Status
// from the enclosing function when it is not OK. The function may return
// absl::Status or absl::StatusOr<T>.
//
//   KVL_RETURN_IF_ERROR(ExpectObject(j, path));
//
// Thread-safe: a macro; it evaluates expr once.
#pragma once

#include "absl/status/status.h"

#define KVL_RETURN_IF_ERROR(expr)                                 \
  do {                                                            \
    if (::absl::Status kvl_status_ = (expr); !kvl_status_.ok()) { \
      return kvl_status_;                                         \
    }                                                             \
  } while (false)
