// What every fuzz target asks of a reader: it returns, or refuses the input with c10::Error.
// Any other outcome (a crash, a sanitizer report, another exception) ends the run as a finding.
#pragma once

#include <c10/util/Exception.h>

namespace dcp::fuzz {

template <typename F>
void returns_or_refuses(F&& read) {
  try {
    (void)read();
  } catch (const c10::Error&) {
    // Refused: the expected outcome for almost every input.
  }
}

}  // namespace dcp::fuzz
