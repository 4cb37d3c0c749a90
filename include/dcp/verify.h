// dcp::verify: checks a checkpoint directory (written by dcp or by Python DCP) without loading
// it into a state dict, and reports every problem it finds, each with the key, the file and the
// byte range. What it checks (docs/reliability.md):
//   - '.metadata' parses with the restricted reader and its decoders, and matches the size and
//     CRC-32 in '.metadata.checksum' (when a dcp save wrote one);
//   - every tensor's chunks lie inside the tensor, do not overlap and cover it exactly once;
//     every chunk and every byte item has a storage entry;
//   - every data file is a regular file inside the directory, every entry's byte range lies
//     inside its file, and no two entries share bytes;
//   - every record decodes, its tensor has the chunk's shape and the tensor's dtype, and its
//     tensor data matches the CRC-32 stored in the record.
//
// Thread-safety: reads only; several verifications may run at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dcp {

/// One problem found by verify.
struct VerifyProblem {
  std::string key;      // the state-dict key ("" when the problem is not a key's)
  std::string file;     // the file, relative to the checkpoint ("" when none)
  int64_t begin = -1;   // the byte range in `file`, or -1 when the problem has none
  int64_t end = -1;
  std::string message;
};

struct VerifyReport {
  std::vector<VerifyProblem> problems;  // in key order, then file order
  int64_t records = 0;                  // records decoded
  int64_t bytes = 0;                    // bytes of the records read
  /// '.metadata' against its checksum file: "verified"; "absent" (Python DCP writes none);
  /// "stale" (written by a save that '.metadata' is not from: Python re-saved into the
  /// directory), when only parsing and validation check it. A mismatch is a problem.
  std::string metadata_checksum;
  bool ok() const { return problems.empty(); }
};

struct VerifyOptions {
  /// Threads reading records.
  int thread_count = 4;
  /// Called after each record is checked, with the records done and the total (from one
  /// thread at a time; for a progress bar). May be empty.
  std::function<void(int64_t done, int64_t total)> progress;
};

/// Verifies the checkpoint in directory `checkpoint_id`. Never throws for a problem of the
/// checkpoint: each one is in the report. Throws only when the arguments are unusable.
VerifyReport verify(const std::string& checkpoint_id, const VerifyOptions& options = {});

}  // namespace dcp
