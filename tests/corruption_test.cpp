// Every byte of a small checkpoint, flipped in turn (issue #13, "integrity you can check"):
// dcp::verify must report each flip of '.metadata' and of its data files, or the flipped
// byte lies in a zip field that no reader uses, listed below with the reason. The checkpoint
// is written by dcp (so '.metadata' has its checksum file) with one file per rank; its items
// are a float tensor, an int64 tensor and a byte item.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "dcp/verify.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

uint64_t le(const std::string& b, uint64_t at, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b[at + k]);
  return v;
}

// The zip fields of a record that no reader of a torch.save record uses, by structure and
// byte offset within it, with the reason. Everything else must be detected.
struct Harmless {
  const char* structure;
  uint64_t begin, end;  // byte offsets within the structure
  const char* reason;
};
const Harmless kHarmless[] = {
    {"local header", 4, 6, "version needed to extract: not checked by miniz or dcp"},
    {"local header", 7, 8, "flag bits 8-15 (bit 11: UTF-8 names): names are compared as bytes"},
    {"local header", 10, 14, "modification time and date: not used"},
    {"local extra", 0, UINT64_MAX,
     "alignment padding (PyTorch's 'FB' extra field): the data's place comes from the header's "
     "extra length; the field itself is never read"},
    {"directory entry", 4, 8, "versions made by / needed to extract: not checked"},
    {"directory entry", 8, 10, "flags: the local header's flags decide where the data is"},
    {"directory entry", 12, 16, "modification time and date: not used"},
    {"directory entry", 34, 42, "disk number, internal and external attributes: not used"},
    {"zip64 end record", 0, 32,
     "signature, record size, versions, disk numbers and per-disk count: the plain end "
     "record's values are used when none of them is 0xFFFF..."},
    {"zip64 end record", 32, 56,
     "entry count, directory size and offset: read only when the plain end record points "
     "to zip64 (its fields are not 0xFFFF...)"},
    {"zip64 locator", 0, 20, "read only when the plain end record points to zip64"},
    {"end record", 4, 10, "disk numbers and the per-disk entry count: not used"},
    {"end record", 20, 22,
     "comment length: the end record is found by its signature and records have no comment"},
};

// Labels byte `at` of a record (dcp's layout: local headers with data and descriptors, the
// directory, the zip64 end record and locator, the end record).
std::string structure_at(const std::string& record, uint64_t at, uint64_t* offset) {
  uint64_t p = 0;
  const uint64_t cd = le(record, record.size() - 22 + 16, 4);
  while (p < cd) {  // local records
    const uint64_t name = le(record, p + 26, 2), extra = le(record, p + 28, 2);
    const uint64_t data = p + 30 + name + extra;
    // The size: from the directory entry with this local header offset.
    uint64_t size = 0;
    for (uint64_t q = cd; le(record, q, 4) == 0x02014b50;
         q += 46 + le(record, q + 28, 2) + le(record, q + 30, 2) + le(record, q + 32, 2)) {
      if (le(record, q + 42, 4) == p) size = le(record, q + 24, 4);
    }
    if (at < p + 30) return *offset = at - p, "local header";
    if (at < p + 30 + name) return *offset = at - p - 30, "local name";
    if (at < data) return *offset = at - p - 30 - name, "local extra";
    if (at < data + size) return *offset = at - data, "record data";
    if (at < data + size + 16) return *offset = at - data - size, "data descriptor";
    p = data + size + 16;
  }
  while (le(record, p, 4) == 0x02014b50) {
    const uint64_t n = 46 + le(record, p + 28, 2) + le(record, p + 30, 2) + le(record, p + 32, 2);
    if (at < p + n) return *offset = at - p, "directory entry";
    p += n;
  }
  if (le(record, p, 4) == 0x06064b50) {
    if (at < p + 56) return *offset = at - p, "zip64 end record";
    p += 56;
  }
  if (le(record, p, 4) == 0x07064b50) {
    if (at < p + 20) return *offset = at - p, "zip64 locator";
    p += 20;
  }
  return *offset = at - p, "end record";
}

const Harmless* harmless(const std::string& structure, uint64_t offset) {
  for (const Harmless& h : kHarmless) {
    if (structure == h.structure && offset >= h.begin && offset < h.end) return &h;
  }
  return nullptr;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_byte(const std::string& path, uint64_t at, char c) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(c);
}

TEST(Corruption, EveryFlippedByteIsDetectedOrListedAsHarmless) {
  testing::TempDir dir;
  const std::string ckpt = dir.sub("c");
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {4, 4}, 1);
  sd["steps"] = testing::make_tensor(at::kLong, {3}, 2);
  sd["note"] = std::string("hello");
  save(sd, ckpt);
  ASSERT_TRUE(verify(ckpt).ok());
  const Metadata md = FileSystemReader(ckpt).read_metadata();

  VerifyOptions one_thread;
  one_thread.thread_count = 1;
  std::map<std::string, int> harmless_seen;  // reason -> flips
  int detected = 0;
  auto flip_each_byte = [&](const std::string& name, const auto& classify) {
    const std::string path = ckpt + "/" + name;
    const std::string original = read_all(path);
    for (uint64_t at = 0; at < original.size(); ++at) {
      write_byte(path, at, static_cast<char>(original[at] ^ 0xFF));
      const VerifyReport report = verify(ckpt, one_thread);
      write_byte(path, at, original[at]);
      if (!report.ok()) {
        ++detected;
        continue;
      }
      const std::string why = classify(at);
      if (why.empty()) {
        ADD_FAILURE() << "flipping byte " << at << " of " << name << " is not detected";
      } else {
        ++harmless_seen[why];
      }
    }
  };
  // '.metadata': its checksum file covers every byte.
  flip_each_byte(".metadata", [](uint64_t) { return std::string(); });
  EXPECT_EQ(verify(ckpt).metadata_checksum, "verified");
  // The checksum file: its save id only tells a corrupt '.metadata' from a stale checksum.
  const std::string sidecar = read_all(ckpt + "/.metadata.checksum");
  flip_each_byte(".metadata.checksum", [&](uint64_t at) -> std::string {
    return at >= sidecar.find("save_id=") + 8 && at + 1 < sidecar.size()
               ? "checksum file: the save id, compared only when the checksum does not match"
               : "";
  });
  // Data files: each byte belongs to one record (the records cover the file).
  std::map<std::string, std::vector<const StorageInfo*>> by_file;
  for (const auto& [index, info] : md.storage_data) by_file[info.relative_path].push_back(&info);
  for (const auto& entry : by_file) {
    const std::string& file = entry.first;  // (structured bindings cannot be captured in C++17)
    const std::vector<const StorageInfo*>& infos = entry.second;
    const std::string bytes = read_all(ckpt + "/" + file);
    flip_each_byte(file, [&](uint64_t at) -> std::string {
      for (const StorageInfo* info : infos) {
        if (at < static_cast<uint64_t>(info->offset) ||
            at >= static_cast<uint64_t>(info->offset + info->length)) {
          continue;
        }
        const std::string record = bytes.substr(info->offset, info->length);
        uint64_t offset = 0;
        const std::string structure = structure_at(record, at - info->offset, &offset);
        const Harmless* h = harmless(structure, offset);
        if (h == nullptr) {
          ADD_FAILURE() << file << " byte " << at << ": " << structure << " byte " << offset
                        << " of the record at " << info->offset;
          return "";
        }
        return std::string(h->structure) + ": " + h->reason;
      }
      return "";
    });
  }
  ASSERT_TRUE(verify(ckpt).ok());  // every byte restored
  std::ostringstream summary;
  for (const auto& [why, n] : harmless_seen) summary << "  " << n << " x " << why << "\n";
  std::cout << detected << " flips detected; undetected, harmless:\n" << summary.str();
  EXPECT_GT(detected, 0);
}

// A byte of '.metadata' changed where the pickle still decodes (a character of the
// checkpoint path it records): the load refuses it, naming both files, unless asked not to
// check; a checkpoint whose checksum file is gone (as Python writes them) loads.
TEST(Corruption, LoadRefusesAMetadataThatNoLongerMatchesItsChecksum) {
  testing::TempDir dir;
  const std::string ckpt = dir.sub("c");
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {4, 4}, 1);
  save(sd, ckpt);
  const std::string path = ckpt + "/.metadata";
  const std::string original = read_all(path);
  const size_t at = original.find(ckpt);
  ASSERT_NE(at, std::string::npos);
  write_byte(path, at + ckpt.size() - 1, 'X');  // ".../c" -> ".../X"
  StateDict out;
  out["w"] = at::zeros({4, 4});
  try {
    load(out, ckpt);
    ADD_FAILURE() << "loaded";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("corrupt checkpoint metadata"), std::string::npos) << message;
    EXPECT_NE(message.find(".metadata.checksum"), std::string::npos) << message;
  }
  const VerifyReport report = verify(ckpt);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].file, ".metadata");

  FileSystemReaderOptions unchecked;
  unchecked.verify_crc32 = false;
  FileSystemReader reader(ckpt, unchecked);
  load(out, reader);
  EXPECT_TRUE(at::equal(out.at("w").tensor(), sd.at("w").tensor()));

  std::remove((ckpt + "/.metadata.checksum").c_str());
  out["w"] = at::zeros({4, 4});
  load(out, ckpt);
  EXPECT_TRUE(at::equal(out.at("w").tensor(), sd.at("w").tensor()));
  EXPECT_EQ(verify(ckpt).metadata_checksum, "absent");
}

}  // namespace
}  // namespace dcp
