// The subcommands of the `dcp` command-line tool (cli/main.cpp parses the arguments with
// CLI11 and calls one of these). Each returns the process's exit status; errors are thrown
// (c10::Error or std::exception) and printed by main as one line.
#pragma once

#include <optional>
#include <string>

namespace dcp::cli {

/// `dcp inspect CKPT [--json] [--keys GLOB]`: keys, kinds, dtypes, shapes, chunks, bytes and
/// files; totals; storage_meta; files per rank.
int inspect(const std::string& checkpoint, bool json, const std::optional<std::string>& keys);

/// `dcp verify CKPT [--threads N]`: dcp::verify, with a progress bar on a terminal. 0 when
/// sound, 1 when not (every problem listed).
int verify(const std::string& checkpoint, int threads, bool json);

/// `dcp diff A B [--keys GLOB] [--json]`: key by key; 0 only when everything is equal.
int diff(const std::string& a, const std::string& b, const std::optional<std::string>& keys,
         bool json);

/// `dcp convert SRC DST`: a checkpoint directory to a torch.save file, or a torch.save file
/// to a checkpoint directory (decided by what SRC is).
int convert(const std::string& source, const std::string& destination, const std::string& to);

/// Whether `key` matches the shell-style `glob` (fnmatch; '*' also matches '.').
bool key_matches(const std::string& glob, const std::string& key);

}  // namespace dcp::cli
