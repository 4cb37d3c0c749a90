// The read schedule of one rank's load plan: which records are read, in which order, which
// byte ranges of their files the reads will touch, and how far ahead of each record those
// ranges are announced to the files (Note [Prefetch] in read_schedule.cpp). A pure function of
// the plan and the metadata, with no IO; read_items executes it.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/metadata.h"
#include "dcp/planner.h"
#include "format/torch_save.h"

namespace dcp::detail {

/// Note [Small records]: a record of at most ReadOptions::whole_record_bytes is read whole with
/// one read and parsed from memory, instead of one read each for its zip directory, its
/// data.pkl and its tensor bytes. A model's many small tensors (norms, biases) then cost one
/// system call each, and one announced range (Note [Prefetch]).
inline constexpr uint64_t kWholeRecordBytes = uint64_t{256} << 10;

/// Announcements closer than ReadOptions::prefetch_merge_gap to the previous one in the same
/// file are merged into one (Note [Prefetch]): the bytes between are few, and one large hint
/// becomes large requests at the disk where thousands of small ones became small requests.
/// A merged announcement is sent once it spans kPrefetchMergeMax bytes.
inline constexpr uint64_t kPrefetchMergeGap = uint64_t{64} << 10;
inline constexpr uint64_t kPrefetchMergeMax = uint64_t{2} << 20;

/// How read_items reads.
struct ReadOptions {
  /// IO threads.
  int thread_count = 1;
  /// Read only the byte range each read needs, straight into the destination when the layout
  /// allows (Note [Ranged reads]); false reads each saved chunk whole and copies from it (the
  /// simple path).
  bool ranged_reads = true;
  /// How many bytes of the coming reads to announce to the files ahead of reading them (Note
  /// [Prefetch]); 0 announces nothing.
  uint64_t prefetch_bytes = 0;
  /// Check the CRC-32 of every tensor storage read whole (Note [CRC on load]).
  bool verify_crc32 = true;
  /// Records of at most this many bytes are read whole (Note [Small records]); 0: none.
  uint64_t whole_record_bytes = kWholeRecordBytes;
  /// Announced ranges this close are merged (kPrefetchMergeGap); 0 merges only touching ones.
  uint64_t prefetch_merge_gap = kPrefetchMergeGap;
};

/// One record, read once for all the plan's reads of it.
struct RecordRead {
  /// The record: file, offset and length (points into the metadata's storage_data).
  const StorageInfo* info = nullptr;
  /// The plan's reads of this record, in plan order (all of one saved item).
  std::vector<const ReadItem*> items;
  /// The byte ranges of the file that reading the record will touch: sorted, disjoint,
  /// absolute. Empty when nothing is announced (prefetch_bytes == 0).
  std::vector<ByteRange> ranges;
  /// Before this record is read, records [0, announce_end) must have been announced: this one
  /// and those that follow within prefetch_bytes of announced ranges.
  size_t announce_end = 0;
};

/// The records in read order: by file, then by offset, so each file is read front to back.
/// Throws when the plan reads an item the metadata has no storage entry for.
/// How many bytes a stored item may decompress to (Note [Compressed items] in read_items.cpp):
/// a tensor chunk's bytes plus kRecordOverheadBound for its zip headers and data.pkl; for a byte
/// item (or a chunk the metadata does not describe), kMaxDecodedValueBytes.
inline constexpr uint64_t kRecordOverheadBound = uint64_t{1} << 20;
inline constexpr uint64_t kMaxDecodedValueBytes = uint64_t{256} << 20;
uint64_t decoded_size_bound(const Metadata& metadata, const ReadItem& item);
/// The same for a saved chunk of `dtype` (nullptr: a byte item); `fqn` is named in errors.
uint64_t decoded_size_bound(c10::ScalarType dtype, const ChunkStorageMetadata* chunk,
                            const std::string& fqn);

std::vector<RecordRead> schedule_reads(const LoadPlan& plan, const Metadata& metadata,
                                       const ReadOptions& options);

/// The first and last element, counted in `strides`, that the box at `offsets` with `lengths`
/// touches: [first, last]; nullopt when the box is empty.
std::optional<std::pair<int64_t, int64_t>> box_extent(c10::IntArrayRef offsets,
                                                      c10::IntArrayRef lengths,
                                                      c10::IntArrayRef strides);

}  // namespace dcp::detail
