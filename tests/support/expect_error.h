// Runs a callable that must throw coc::Error and returns the error, so a test can check its kind and message.
#pragma once

#include <gtest/gtest.h>

#include "coc/core/error.h"

namespace coc::test {

template <typename F>
Error expect_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a coc::Error";
  return Error(ErrorKind::kInternal, "no error thrown");
}

}  // namespace coc::test
