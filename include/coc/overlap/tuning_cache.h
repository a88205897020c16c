// --coc-tuning-cache FILE: the choices of --coc-parallel-num auto that were timed, kept across runs.
//
// Timing the candidates costs ~25 op-times per shape (auto_schedule.cpp); on the shaped cluster the first
// iteration took ~17 s against 1.6 s for the others, and every run paid it again. The cache stores each timed
// choice under everything that decided it, and the next run takes it without timing when all of it matches:
//   op, m, k, n (k and n as the ops agree on them: the per-rank dimension is the maximum over ranks),
//   deterministic mode, the GEMMs' and the messages' element types (--bf16 changes both), group size, the link (link_fingerprint(): the hosts of the group's ranks, in rank order,
//   and the transport settings, the progress engine and --comm-nonblocking-impl), the MPI library
//   (library_version()) and the coc version.
// An entry for the same op and shape whose link, library, group size or version differ is foreign or stale: the
// shape is timed again and the new entry is added beside it (the old one stays valid for its own setting).
//
// The file is JSON: {"format": "coc-tuning-cache", "version": 1, "entries": [{...}, ...]}. World rank 0 reads it
// once and broadcasts it, so every rank holds the same entries and takes the same choice without a collective;
// rank 0 of each tp group still broadcasts the pick it takes (auto_schedule.cpp). World rank 0 writes it (temporary
// file + fsync + rename, so a reader never sees half a file) with the entries it loaded and the choices its own tp
// group timed. A file that is not a tuning cache (not JSON, another format, a bad entry) is refused with one line
// naming the file and the byte or entry, before any training: a corrupt cache is never half-trusted.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/overlap/coc_ops.h"

namespace coc {

/// What one cached choice was made for and what it is. Shapes in rows/elements; times in ms.
struct TuningEntry {
  std::string op;           ///< "matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul[_v2]"
  int64_t m = 0, k = 0, n = 0;  ///< the GEMM shape the choice was timed on (see the file comment)
  bool deterministic = false;
  /// The GEMMs' compute type and the messages' element type ("fp32", "bf16", "fp16"; gemm_compute_type(),
  /// CocOptions::comm_dtype). Entries written before these fields existed are fp32.
  std::string gemm_dtype = "fp32", comm_dtype = "fp32";
  int group_size = 0;       ///< ranks of the tp group
  std::string link;         ///< link_fingerprint() of the group
  std::string mpi_library;  ///< library_version() of the group's rank 0
  std::string coc_version;  ///< COC_VERSION of the binary that timed it and its tuner's candidates and rules
  int parallel_num = 1;     ///< the choice: N (1 = serial)
  CocCommAlgo algo = CocCommAlgo::kCollective;
  std::vector<std::pair<std::string, double>> candidates_ms;  ///< the timings that decided it, for the record
  /// The same op, shape, mode, group size, link, library and version: the entry may be used for `key`.
  bool matches(const TuningEntry& key) const;
  /// The same op, shape, mode and element types (whatever the setting): `key` would replace nothing, but an entry of another
  /// setting exists (reported as foreign when it is re-timed).
  bool same_shape(const TuningEntry& key) const;
};

class TuningCache {
 public:
  /// Collective over `world`: world rank 0 reads `path` (a missing file is an empty cache; its folder must exist)
  /// and broadcasts the text; every rank parses it. Throws a uniform kInvalidArgument error, on every rank, naming
  /// --coc-tuning-cache, the file and what is wrong (not JSON at byte N, another format, entry i lacks a field) with
  /// the fix (delete the file or pass another).
  static std::shared_ptr<TuningCache> open(Communicator& world, const std::string& path);
  /// Parses the text of the cache file `path` (named in errors, which are open's); an empty text is an empty cache.
  /// `writer`: this process writes the file on save() (world rank 0).
  static std::shared_ptr<TuningCache> parse(const std::string& text, const std::string& path, bool writer);

  /// The entry usable for `key` (TuningEntry::matches), if any. Thread-safe.
  std::optional<TuningEntry> find(const TuningEntry& key) const;
  /// True when an entry of the same op and shape exists for another setting (a foreign or stale entry).
  bool has_other_setting(const TuningEntry& key) const;
  /// Adds a freshly timed choice (replacing an entry that matches the same key). Thread-safe.
  void store(TuningEntry e);
  /// Writes the file if this process is its writer (world rank 0) and something was stored since the last save.
  /// Temporary file + fsync + rename. Throws kIo naming the file when it cannot be written.
  void save();
  const std::string& path() const { return path_; }
  size_t size() const;

 private:
  TuningCache(std::string path, bool writer) : path_(std::move(path)), writer_(writer) {}
  std::string path_;
  bool writer_ = false;
  mutable std::mutex mu_;
  std::vector<TuningEntry> entries_;
  bool dirty_ = false;
};

/// The link a tp group's ranks talk over, as one line: the hosts of its ranks in rank order (MPI_Get_processor_name)
/// and the transport settings that change its speed (Open MPI's btl and btl_tcp_if_include, the engine). Collective
/// over `group` (a gather and a broadcast; computed once per communicator and kept).
std::string link_fingerprint(Communicator& group);

/// The cache --coc-parallel-num auto consults and fills (nullptr: none, the default). Set once before training
/// (coc train --coc-tuning-cache); not for concurrent use with running ops.
void set_tuning_cache(std::shared_ptr<TuningCache> cache);
std::shared_ptr<TuningCache> tuning_cache();

}  // namespace coc
