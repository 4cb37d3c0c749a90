// `dcp verify` (see commands.h): dcp::verify with a progress bar on a terminal.
#include "dcp/verify.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"

namespace dcp::cli {

int verify(const std::string& checkpoint, int threads, bool json) {
  VerifyOptions options;
  options.thread_count = threads;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  if (tty) {
    options.progress = [](int64_t done, int64_t total) {
      constexpr int kWidth = 40;
      const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
      std::fprintf(stderr, "\rverifying [%s%s] %lld/%lld records", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(done),
                   static_cast<long long>(total));
      if (done == total) std::fprintf(stderr, "\n");
    };
  }
  const VerifyReport report = dcp::verify(checkpoint, options);
  if (json) {
    nlohmann::ordered_json out;
    out["checkpoint"] = checkpoint;
    out["ok"] = report.ok();
    out["records"] = report.records;
    out["bytes"] = report.bytes;
    out["metadata_checksum"] = report.metadata_checksum;
    out["problems"] = nlohmann::ordered_json::array();
    for (const auto& p : report.problems) {
      out["problems"].push_back({{"key", p.key},
                                 {"file", p.file},
                                 {"begin", p.begin},
                                 {"end", p.end},
                                 {"message", p.message}});
    }
    std::cout << out.dump(2) << "\n";
    return report.ok() ? 0 : 1;
  }
  for (const auto& p : report.problems) {
    std::cout << "problem:";
    if (!p.key.empty()) std::cout << " key '" << p.key << "'";
    if (!p.file.empty()) std::cout << " file '" << p.file << "'";
    if (p.begin >= 0) std::cout << " bytes [" << p.begin << ", " << p.end << ")";
    std::cout << ": " << p.message << "\n";
  }
  std::cout << (report.ok() ? "sound" : "NOT SOUND") << ": " << checkpoint << ": " << report.records
            << " records, " << report.bytes << " bytes checked, " << report.problems.size()
            << " problem(s); .metadata checksum "
            << (report.metadata_checksum.empty() ? "not read" : report.metadata_checksum) << "\n";
  return report.ok() ? 0 : 1;
}

}  // namespace dcp::cli
