// datasets/shards/names.h (build-only): where a shard's index lies, by the shard's name. The
// public half of the shard names (brace expansion, parse_shard_location, split_shard_patterns,
// names_tar_shards) is in conveyor/datasets.h; both live in names.cpp.
//
// Rule: a shard named PREFIX-NNNNNN.tar (any number of digits) is indexed by PREFIX.index.json
// beside it: in the same folder, beside the URL (without its query string), or, for pipe:COMMAND,
// what the same command writes with its shard word (the last word ending in .tar) so renamed.
#pragma once

#include <filesystem>
#include <string>

#include "conveyor/datasets.h"

namespace conveyor::detail {

// The shard's file name, as its index lists it: the last path segment (of a URL, without its
// query string or fragment; of a command, of its shard word). Empty for a command without one.
std::string file_name_of(const ShardLocation& shard);
// Where PREFIX-NNNNNN.tar's index PREFIX.index.json lies, of the shard's own kind: beside a local
// shard a local path (never a pattern or a command, whatever the name holds), beside a URL a URL,
// a pipe: shard's index the same command with its shard word renamed. Throws
// std::invalid_argument naming the shard when its name is not of that form.
ShardLocation index_location_for(const ShardLocation& shard);
// The shard's name fits PREFIX-NNNNNN.tar, so that an index can be looked for beside it.
bool has_index_name(const ShardLocation& shard);

// Names that come from data (an index's class names, sample keys), never trusted, before they
// become part of a path: each must be one path segment. Throws std::invalid_argument
// "WHAT 'NAME': WHY" (control bytes shown as \xNN) when it is empty, "." or "..", or holds '/',
// '\\' or NUL (so an absolute path is refused too).
void check_path_segment(const std::string& name, const std::string& what);

// `root / name` for such a name: checked by check_path_segment first, and the joined path again
// after the join: lexically normalised, it must lie strictly under `root`, lexically normalised.
// Throws std::invalid_argument naming the name and the path.
std::filesystem::path path_under(const std::filesystem::path& root, const std::string& name,
                                 const std::string& what);

}  // namespace conveyor::detail
