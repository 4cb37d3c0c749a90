// with_context: the one way dcp adds context to an error on its way up (docs/design.md,
// Errors). The exception keeps its type (c10::Error, ValueError, TypeError,
// NotImplementedError, ...), its message and its backtrace; the context is appended with
// c10::Error::add_context. Each layer adds what only it knows, once: storage the item, file and
// byte range; the protocol the rank and the checkpoint. Other exception types pass unchanged.
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <utility>

namespace dcp::detail {

/// Returns f(); if it throws a c10::Error, appends context() (called only then) and rethrows
/// the same exception object.
template <typename F, typename Context>
auto with_context(F&& f, Context&& context) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (c10::Error& e) {
    e.add_context(std::string(context()));
    throw;
  }
}

}  // namespace dcp::detail
