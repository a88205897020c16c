// The problem files of `coc bench overlap` (bench/inputs/*.yaml): per-rank GEMM shapes of one model's
// tensor-parallel layers at a given tp.
//
//   model: LLaMA2-7B                # free text, reported with every row
//   tp: 2                           # the tp the per-rank shapes were computed for
//   notes: "..."                    # optional: where the shapes come from
//   problems:
//     - name: qkv                   # unique within the file
//       layer: column               # column → all_gather; row → all_reduce, reduce_scatter (docs/semantics.md §2)
//       m: 128                      # tokens (rows of the gathered / full activation), a multiple of the run's tp
//       k: 4096                     # this rank's in-features
//       n: 6144                     # this rank's out-features
//       ops: [all_gather]           # optional: overrides the ops the layer implies
//
// Every figure of a row refers to the per-rank GEMM [m, k] · [k, n]: all_reduce reduces [m, n], reduce_scatter
// scatters [m, n] into [m/T, n], all_gather gathers [m/T, k] into [m, k].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace coc::cli::bench {

struct Problem {
  std::string name, layer;
  int64_t m = 0, k = 0, n = 0;
  std::vector<std::string> ops;  ///< "all_reduce", "reduce_scatter", "all_gather"
};

struct ProblemFile {
  std::string path, model, notes;
  int tp = 0;
  std::vector<Problem> problems;
};

/// The op names the bench knows, in report order.
const std::vector<std::string>& bench_ops();

/// Loads and validates `path`; with `only` non-empty, keeps (and checks the shapes of) that problem alone, so the
/// result is empty when the file has no such problem. `m_scale` multiplies every m (tokens; rounded to a multiple
/// of `run_tp`, at least run_tp). Throws a uniform kInvalidArgument naming the file, the problem and the fix for a
/// missing file or a directory, malformed YAML, a missing or unknown key, non-positive shapes, an unknown, repeated
/// or empty list of ops, an unknown layer, or an m that is not a multiple of `run_tp` (reduce_scatter and
/// all_gather give every rank an equal share in the benchmark).
ProblemFile load_problems(const std::string& path, int run_tp, double m_scale, const std::string& only = "");

}  // namespace coc::cli::bench
