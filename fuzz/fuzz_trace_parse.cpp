// libFuzzer target for the trace readers (analyze_file): any byte string must either give a report or throw
// coc::Error, never crash, hang, leak or read out of bounds (issue 3; edge cases 22-29 of docs/edge-cases.md). Built
// and run by fuzz/run.sh with clang++ -fsanitize=fuzzer,address,undefined.
//
// analyze_file reads a path, so each input is written to a per-process file on tmpfs first. Both the exact and
// the HTA convention run, since HTA's inward µs rounding and step dropping are separate code paths.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "coc/analysis/analyze.h"
#include "coc/core/error.h"

namespace {

std::string scratch_path() {
  const char* dir = std::getenv("COC_FUZZ_TMP");
  return std::string(dir ? dir : "/dev/shm") + "/coc_fuzz_" + std::to_string(::getpid()) + ".json";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = scratch_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  for (auto conv : {coc::analysis::Convention::kExact, coc::analysis::Convention::kHta}) {
    coc::analysis::AnalyzeOptions opt;
    opt.convention = conv;
    opt.threads = 1;
    try {
      auto ranks = coc::analysis::analyze_file(path, opt);
      // Invariant of docs/semantics.md §7, whatever the input: computing + exposed + free == window, none negative.
      for (const auto& r : ranks)
        for (const auto& s : r.steps) {
          const auto& b = s.split;
          if (b.computing < 0 || b.exposed < 0 || b.free < 0 || b.overlapped < 0 ||
              b.computing + b.exposed + b.free != b.window)
            std::abort();
        }
    } catch (const coc::Error&) {
      // Rejected input, with a message: the expected outcome for most mutations.
    }
  }
  return 0;
}
