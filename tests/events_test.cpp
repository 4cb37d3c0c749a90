// Events and the default logger (dcp/events.h): what a save, a load and an async save report,
// in order, with bytes and files that match the checkpoint; failures end as failed; the info
// logger's one line per save and load.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

struct Recorded {
  std::vector<Event> events;
  EventHook hook() {
    return [this](const Event& e) { events.push_back(e); };
  }
  std::vector<std::string> sequence() const {
    std::vector<std::string> out;
    for (const Event& e : events)
      out.push_back(std::string(phase_name(e.phase)) + (e.end ? " end" : ""));
    return out;
  }
  const Event& last(Phase phase) const {
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (it->phase == phase && it->end) return *it;
    }
    throw std::runtime_error("no end event");
  }
};

int64_t stored_bytes(const Metadata& md) {
  int64_t n = 0;
  for (const auto& [index, info] : md.storage_data) n += info.length;
  return n;
}

TEST(Events, SaveAndLoadReportTheirPhasesWithBytesAndFiles) {
  testing::TempDir dir;
  const StateDict sd = testing::reference_state_dict();
  Recorded saved;
  SaveOptions so;
  so.on_event = saved.hook();
  const Metadata md = save(sd, dir.sub("c"), so);
  EXPECT_EQ(saved.sequence(),
            (std::vector<std::string>{"save", "plan", "plan end", "write", "write end", "commit",
                                      "commit end", "save end"}));
  EXPECT_TRUE(saved.last(Phase::kSave).ok);
  EXPECT_EQ(saved.last(Phase::kSave).bytes, stored_bytes(md));
  EXPECT_EQ(saved.last(Phase::kWrite).bytes, stored_bytes(md));
  EXPECT_EQ(saved.last(Phase::kSave).files, 1);
  EXPECT_EQ(saved.last(Phase::kSave).checkpoint_id, dir.sub("c"));
  EXPECT_GT(saved.last(Phase::kSave).seconds, 0);

  Recorded loaded;
  LoadOptions lo;
  lo.on_event = loaded.hook();
  StateDict out = testing::blank_like(sd);
  load(out, dir.sub("c"), lo);
  EXPECT_EQ(loaded.sequence(),
            (std::vector<std::string>{"load", "plan", "plan end", "read", "read end", "load end"}));
  // Every record but those of tensors without elements, which a load has nothing to read from.
  int64_t read = 0;
  for (const auto& [index, info] : md.storage_data) {
    const auto* t = std::get_if<TensorStorageMetadata>(&md.state_dict_metadata.at(index.fqn));
    int64_t numel = 1;
    if (t != nullptr) {
      for (int64_t d : t->size) numel *= d;
    }
    if (numel > 0) read += info.length;
  }
  EXPECT_EQ(loaded.last(Phase::kLoad).bytes, read);
  EXPECT_EQ(loaded.last(Phase::kRead).files, 1);
}

TEST(Events, AFailedSaveEndsAsFailed) {
  testing::TempDir dir;
  Recorded saved;
  SaveOptions so;
  so.on_event = saved.hook();
  so.planner = std::make_shared<testing::FailingSavePlanner>(0);
  EXPECT_THROW(save(testing::reference_state_dict(), dir.sub("c"), so), c10::Error);
  EXPECT_FALSE(saved.last(Phase::kSave).ok);
  EXPECT_EQ(saved.sequence().back(), "save end");
}

TEST(Events, AsyncSaveReportsStagingThenTheSave) {
  testing::TempDir dir;
  Recorded saved;
  AsyncSaveOptions so;
  so.on_event = saved.hook();
  async_save(testing::reference_state_dict(), dir.sub("c"), so).get();
  const auto seq = saved.sequence();
  ASSERT_GE(seq.size(), 4u);
  EXPECT_EQ(seq[0], "stage");
  EXPECT_EQ(seq[1], "stage end");
  EXPECT_EQ(seq[2], "save");
  EXPECT_EQ(seq.back(), "save end");
  EXPECT_TRUE(saved.last(Phase::kStage).ok);
}

TEST(Events, TheInfoLoggerPrintsOneLinePerSaveAndLoad) {
  testing::TempDir dir;
  const StateDict sd = testing::reference_state_dict();
  const LogLevel before = log_level();
  set_log_level(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  save(sd, dir.sub("c"));
  StateDict out = testing::blank_like(sd);
  load(out, dir.sub("c"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_log_level(before);
  EXPECT_TRUE(std::regex_search(
      err, std::regex("dcp: saved [0-9.]+ GB to .*/c in [0-9.]+ s \\([0-9.]+ GB/s; plan [0-9.]+ "
                      "s, write [0-9.]+ s, commit [0-9.]+ s; 1 rank, 1 files\\)\n")))
      << err;
  EXPECT_TRUE(std::regex_search(
      err, std::regex("dcp: loaded [0-9.]+ GB from .*/c in [0-9.]+ s \\([0-9.]+ GB/s; plan "
                      "[0-9.]+ s, read [0-9.]+ s; 1 rank, 1 files\\)\n")))
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 2) << err;
}

}  // namespace
}  // namespace dcp
