// The read schedule (storage/read_schedule.h) and the record geometry it uses
// (format/torch_save.h), tested with tables as Arrow tests CoalesceReadRanges: for a plan and a
// metadata, which records are read in which order, which byte ranges each announces, and how far
// the announcements run ahead of each record.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dcp/metadata.h"
#include "dcp/planner.h"
#include "format/torch_save.h"
#include "storage/read_schedule.h"

namespace dcp::detail {
namespace {

using Ranges = std::vector<ByteRange>;

std::string show(const Ranges& ranges) {
  std::string s;
  for (const ByteRange& r : ranges) {
    s += "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") ";
  }
  return s;
}

// A float tensor of `rows` x 64 saved as one chunk in `file` at `offset`, its record `slack`
// bytes longer than its data.
void add_tensor(Metadata& md, const std::string& fqn, int64_t rows, const std::string& file,
                int64_t offset, int64_t slack) {
  TensorStorageMetadata t;
  t.size = {rows, 64};
  t.chunks.push_back({{0, 0}, {rows, 64}});
  md.state_dict_metadata[fqn] = t;
  md.storage_data[MetadataIndex(fqn, std::vector<int64_t>{0, 0})] =
      StorageInfo{file, offset, rows * 64 * 4 + slack, {}};
}

void add_bytes(Metadata& md, const std::string& fqn, const std::string& file, int64_t offset,
               int64_t length) {
  md.state_dict_metadata[fqn] = BytesStorageMetadata{};
  md.storage_data[MetadataIndex(fqn)] = StorageInfo{file, offset, length, {}};
}

ReadItem rows_of(const std::string& fqn, int64_t first, int64_t count) {
  ReadItem item;
  item.dest_index = MetadataIndex(fqn, std::vector<int64_t>{0, 0});
  item.dest_offsets = {0, 0};
  item.storage_index = MetadataIndex(fqn, std::vector<int64_t>{0, 0});
  item.storage_offsets = {first, 0};
  item.lengths = {count, 64};
  return item;
}

ReadItem bytes_of(const std::string& fqn) {
  ReadItem item;
  item.type = LoadItemType::BYTE_IO;
  item.dest_index = MetadataIndex(fqn);
  item.storage_index = MetadataIndex(fqn);
  return item;
}

TEST(RecordGeometryTest, HeadDataAndTailBoundWhereTheBytesCanSit) {
  struct Case {
    uint64_t length, data_bytes;
    ByteRange head, tail, data_0_16;
  };
  const std::vector<Case> cases = {
      // 16 KiB of data and 1000 bytes of headers: the tail is the zip reader's 4 KiB.
      {17384, 16384, {0, 1000}, {13288, 17384}, {0, 1016}},
      // Headers longer than 4 KiB: the tail is the headers' length.
      {20000, 10000, {0, 10000}, {10000, 20000}, {0, 10016}},
      // A record shorter than 4 KiB is read whole for its tail.
      {1000, 900, {0, 100}, {0, 1000}, {0, 116}},
      // No data at all.
      {300, 0, {0, 300}, {0, 300}, {0, 300}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.length);
    const auto g = RecordGeometry::of(c.length, c.data_bytes);
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(g->head(), c.head);
    EXPECT_EQ(g->tail(), c.tail);
    EXPECT_EQ(g->data(0, 16), c.data_0_16);
  }
  EXPECT_FALSE(RecordGeometry::of(100, 101).has_value());  // the chunk cannot fit
}

TEST(ReadScheduleTest, RecordsAreReadByFileThenOffsetAndEachOnce) {
  Metadata md;
  add_tensor(md, "a", 4, "__0_1.distcp", 5000, 900);
  add_tensor(md, "b", 4, "__0_0.distcp", 9000, 900);
  add_tensor(md, "c", 4, "__0_0.distcp", 100, 900);
  add_bytes(md, "step", "__0_1.distcp", 0, 700);
  LoadPlan plan;
  plan.items = {rows_of("a", 0, 2), rows_of("b", 0, 4), bytes_of("step"), rows_of("a", 2, 2),
                rows_of("c", 1, 1)};
  const auto schedule = schedule_reads(plan, md, ReadOptions{});
  std::vector<std::string> order;
  for (const RecordRead& r : schedule) {
    order.push_back(r.info->relative_path + "@" + std::to_string(r.info->offset) + ":" +
                    std::to_string(r.items.size()));
    EXPECT_TRUE(r.ranges.empty());  // nothing is announced without a window
    EXPECT_EQ(r.announce_end, 0u);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"__0_0.distcp@100:1", "__0_0.distcp@9000:1",
                                             "__0_1.distcp@0:1", "__0_1.distcp@5000:2"}));
  // Both reads of "a", in plan order.
  EXPECT_EQ(schedule[3].items[0]->storage_offsets, (Dims{0, 0}));
  EXPECT_EQ(schedule[3].items[1]->storage_offsets, (Dims{2, 0}));
}

TEST(ReadScheduleTest, AnnouncedRangesAreHeadDataAndTail) {
  // "w" is 64 rows x 256 B = 16 KiB of data in a record of 17384 bytes at file offset 1000:
  // head [1000, 2000), tail [1000 + 13288, 1000 + 17384). Row r's bytes are [256 r, 256 (r+1)).
  struct Case {
    const char* name;
    std::vector<ReadItem> items;
    bool ranged_reads;
    Ranges expected;
  };
  const uint64_t o = 1000;
  const std::vector<Case> cases = {
      {"rows 16..32", {rows_of("w", 16, 16)}, true,
       {{o, o + 1000}, {o + 4096, o + 1000 + 8192}, {o + 13288, o + 17384}}},
      {"two overlapping boxes merge", {rows_of("w", 16, 16), rows_of("w", 24, 16)}, true,
       {{o, o + 1000}, {o + 4096, o + 1000 + 10240}, {o + 13288, o + 17384}}},
      {"an empty box adds nothing", {rows_of("w", 16, 0)}, true,
       {{o, o + 1000}, {o + 13288, o + 17384}}},
      {"the last rows reach the tail", {rows_of("w", 48, 16)}, true,
       {{o, o + 1000}, {o + 12288, o + 17384}}},
      {"whole records on the simple path", {rows_of("w", 16, 16)}, false, {{o, o + 17384}}},
      {"byte items are whole records", {bytes_of("step")}, true, {{0, 700}}},
  };
  Metadata md;
  add_tensor(md, "w", 64, "__0_0.distcp", 1000, 1000);
  add_bytes(md, "step", "__0_0.distcp", 0, 700);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LoadPlan plan;
    plan.items = c.items;
    // whole_record_bytes 0: this small record is read by ranges (Note [Small records]).
    const auto schedule = schedule_reads(plan, md, ReadOptions{1, c.ranged_reads, 1, true, 0});
    ASSERT_EQ(schedule.size(), 1u);
    EXPECT_EQ(schedule[0].ranges, c.expected)
        << "got " << show(schedule[0].ranges) << ", expected " << show(c.expected);
  }
}

// Note [Small records]: a record of at most whole_record_bytes is announced (and read) whole,
// however little of it a read needs; a longer one by ranges.
TEST(ReadScheduleTest, RecordsUpToWholeRecordBytesAreAnnouncedWhole) {
  Metadata md;
  add_tensor(md, "w", 64, "__0_0.distcp", 1000, 1000);  // a record of 17384 bytes at 1000
  LoadPlan plan;
  plan.items = {rows_of("w", 16, 16)};
  for (const uint64_t limit : {uint64_t{17384}, uint64_t{1} << 20, kWholeRecordBytes}) {
    SCOPED_TRACE(limit);
    const auto schedule = schedule_reads(plan, md, ReadOptions{1, true, 1, true, limit});
    EXPECT_EQ(schedule[0].ranges, (Ranges{{1000, 18384}})) << show(schedule[0].ranges);
  }
  const auto ranged = schedule_reads(plan, md, ReadOptions{1, true, 1, true, 17383});
  EXPECT_EQ(ranged[0].ranges.size(), 3u) << show(ranged[0].ranges);
}

TEST(ReadScheduleTest, MetadataThatCannotHoldTheChunkIsAnnouncedWhole) {
  Metadata md;
  add_tensor(md, "w", 64, "__0_0.distcp", 0, 0);
  md.storage_data.begin()->second.length = 100;  // shorter than the chunk's 16 KiB
  LoadPlan plan;
  plan.items = {rows_of("w", 0, 1)};
  const auto schedule = schedule_reads(plan, md, ReadOptions{1, true, 1, true, 0});
  EXPECT_EQ(schedule[0].ranges, (Ranges{{0, 100}}));
}

TEST(ReadScheduleTest, AnnouncementsRunAheadByTheWindow) {
  // Three byte records of 100, 200 and 300 bytes: 0, 100 and 300 announced bytes come before
  // them.
  Metadata md;
  add_bytes(md, "a", "f", 0, 100);
  add_bytes(md, "b", "f", 100, 200);
  add_bytes(md, "c", "f", 300, 300);
  LoadPlan plan;
  plan.items = {bytes_of("a"), bytes_of("b"), bytes_of("c")};
  struct Case {
    uint64_t window;
    std::vector<size_t> announce_end;
  };
  const std::vector<Case> cases = {
      {1, {1, 2, 3}},     // each record just before it is read
      {100, {1, 2, 3}},   // the next record starts 100 bytes ahead: not within 100
      {150, {2, 2, 3}},   // "b" is within 150 of "a"; "c" is 200 past "b"
      {301, {3, 3, 3}},   // everything before the first read
      {1 << 30, {3, 3, 3}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.window);
    const auto schedule = schedule_reads(plan, md, ReadOptions{1, true, c.window});
    std::vector<size_t> got;
    for (const RecordRead& r : schedule) got.push_back(r.announce_end);
    EXPECT_EQ(got, c.announce_end);
  }
}

TEST(ReadScheduleTest, AReadWithoutAStorageEntryNamesTheItem) {
  Metadata md;
  add_tensor(md, "w", 4, "f", 0, 900);
  LoadPlan plan;
  ReadItem orphan = rows_of("w", 0, 1);
  orphan.storage_index.offset = std::vector<int64_t>{2, 0};
  plan.items = {orphan};
  try {
    schedule_reads(plan, md, ReadOptions{});
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no storage entry for 'w' chunk at [2, 0]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dcp::detail
