// datasets/shards/names.h (build-only): where a shard's index lies, by the shard's name. The
// public half of the shard names (brace expansion, parse_shard_location, split_shard_patterns,
// names_tar_shards) is in conveyor/datasets.h; both live in names.cpp.
//
// Rule: a shard named PREFIX-NNNNNN.tar (any number of digits) is indexed by PREFIX.index.json
// beside it: in the same folder, beside the URL (without its query string), or, for pipe:COMMAND,
// what the same command writes with its shard word (the last word ending in .tar) so renamed.
#pragma once

#include <string>

#include "conveyor/datasets.h"

namespace conveyor::detail {

// The shard's file name, as its index lists it: the last path segment (of a URL, without its
// query string or fragment; of a command, of its shard word). Empty for a command without one.
std::string file_name_of(const ShardLocation& shard);
// PREFIX.index.json for PREFIX-NNNNNN.tar, as a name parse_shard_location reads. Throws
// std::invalid_argument naming the shard when its name is not of that form.
std::string index_location_for(const ShardLocation& shard);
// The shard's name fits PREFIX-NNNNNN.tar, so that an index can be looked for beside it.
bool has_index_name(const ShardLocation& shard);

}  // namespace conveyor::detail
