// Every on-disk name of a checkpoint, in one place (PyTorch DCP's names, docs/format.md §1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dcp::detail::paths {

/// The committed metadata: ".metadata".
std::string metadata_file();
/// A rank's own metadata when a save ran without collectives (Python's use_collectives=False):
/// "__{rank}.metadata".
std::string rank_metadata_file(int rank);
/// Where the rank writes it before the rename: "__{rank}.metadata.tmp".
std::string rank_metadata_temp_file(int rank);
/// The rank of a "__{rank}.metadata" name; nullopt for any other name.
std::optional<int> parse_rank_metadata_file(const std::string& name);
/// Where the coordinator writes the metadata before the rename: ".metadata.tmp".
std::string metadata_temp_file();
/// The per-rank file prefix the coordinator assigns: Python's "__{rank}_", or with a save token
/// "__{rank}_{token}_" (Note [Re-save] in filesystem_writer.cpp).
std::string rank_prefix(int rank, const std::string& save_token = "");
/// The short token that makes a save's data file names unique: the first 8 hex digits of its
/// save id.
std::string save_token(const std::string& save_id);
/// The checksum of the committed metadata (Note [Metadata checksum]): ".metadata.checksum".
std::string metadata_checksum_file();
/// Where the coordinator writes it before the rename: ".metadata.checksum.tmp".
std::string metadata_checksum_temp_file();
/// The lock a save holds on its checkpoint directory: ".dcp_lock".
std::string lock_file();
/// A data file: "{prefix}{index}.distcp", e.g. "__3_0.distcp".
std::string data_file(const std::string& prefix, int index);
/// The shared-directory probe of one save: ".dcp_probe_{save_id}".
std::string probe_file(const std::string& save_id);
/// Whether `name` is a data file name ("__*_*.distcp").
bool is_data_file(const std::string& name);
/// A Hugging Face model file: "model-{index:05}-of-{count:05}.safetensors", or with a shard
/// (save_distributed) "shard-{shard:05}-model-{index:05}-of-{count:05}.safetensors".
std::string hf_model_file(int index, int count, std::optional<int> shard = std::nullopt);
/// The index of a sharded Hugging Face model: "model.safetensors.index.json".
std::string hf_index_file();
/// Where HuggingFaceStorageWriter with enable_consolidation writes the chunked files before
/// consolidating them (Python's SHARDED_DIR_NAME): "sharded".
std::string hf_sharded_directory();
/// Where a Hugging Face file is written before its rename: "<name>.tmp".
std::string hf_temp_file(const std::string& name);
/// A CheckpointManager's directory of one step under its root: "step_{step}".
std::string step_directory(int64_t step);
/// The step of a "step_{N}" name (N decimal, >= 0, no sign or leading zeros); nullopt otherwise.
std::optional<int64_t> parse_step_directory(const std::string& name);
/// `name` with bytes outside printable ASCII escaped as \xNN, for messages.
std::string printable(const std::string& name);
/// Throws unless `relative` (a file name read from a checkpoint's metadata) can only name a
/// file below the checkpoint directory: not empty, not absolute, no NUL byte, no empty, "." or
/// ".." component. The message names the entry, with unprintable bytes escaped.
void check_relative_name(const std::string& relative);

}  // namespace dcp::detail::paths
