// coc: entry point. Brings MPI up, parses the command line and runs one subcommand under the job-wide error
// policy (coc/comm/error_policy.h): a uniform error (bad flags/config, seen identically by every rank) is printed
// once by rank 0 as one line and every rank exits with the error kind's code; any other error is printed with its
// rank and the job is aborted with MPI_Abort so that no peer hangs (edge case 18 of docs/edge-cases.md).
// `coc analyze` is the exception: it reads files on one process and runs without MPI_Init (no mpirun needed).
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/did_you_mean.h"
#include "coc/comm/communicator.h"
#include "coc/comm/error_policy.h"
#include "coc/comm/process.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/kernels/blas_core.h"
#include "coc/runtime/memory.h"

namespace {

/// Every subcommand under `app`, depth first, with its path from the root ("train", "bench train").
void collect_subcommands(CLI::App* app, const std::string& path, std::vector<std::pair<CLI::App*, std::string>>& out) {
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    const std::string name = path.empty() ? sub->get_name() : path + " " + sub->get_name();
    out.emplace_back(sub, name);
    collect_subcommands(sub, name, out);
  }
}

/// CLI11 prints a negated switch as "--sequence-parallel, --no-sequence-parallel{false}", which reads like a default
/// value: the help shows the names alone (each description says what the default is).
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::string s = CLI::Formatter::make_option_name(opt, is_positional);
    for (size_t open = s.find('{'); open != std::string::npos; open = s.find('{', open)) {
      const size_t close = s.find('}', open);
      if (close == std::string::npos) break;
      s.erase(open, close + 1 - open);
    }
    return s;
  }
};

/// The deepest subcommand named on the command line ("coc bench train" → bench train), its path from the root,
/// and the index of the first argument after it; `app` itself when none is named.
struct Named {
  CLI::App* app;
  std::string path;
  int next;
};
Named deepest_subcommand(CLI::App& app, int argc, char** argv) {
  Named n{&app, "", 1};
  for (; n.next < argc; ++n.next) {
    CLI::App* sub_found = nullptr;
    for (CLI::App* sub : n.app->get_subcommands([](CLI::App*) { return true; }))
      if (sub->get_name() == argv[n.next]) sub_found = sub;
    if (!sub_found) break;
    n.app = sub_found;
    n.path = n.path.empty() ? sub_found->get_name() : n.path + " " + sub_found->get_name();
  }
  return n;
}

/// For a rejected command line: "; --op is a flag of coc check" when a --flag the subcommand lacks belongs to
/// another subcommand (users mix up train and check flags); "" otherwise. The subcommand is the deepest one named
/// on the command line ("coc bench train" is checked against bench train's flags, not bench's), and its own
/// subcommands are searched first ("coc bench --train-iters 2" points to coc bench train, not coc train).
std::string other_subcommand_hint(CLI::App& app, int argc, char** argv) {
  const Named n = deepest_subcommand(app, argc, argv);
  CLI::App* here = n.app;
  if (here == &app) return "";
  std::vector<std::pair<CLI::App*, std::string>> candidates;
  collect_subcommands(here, n.path, candidates);
  collect_subcommands(&app, "", candidates);
  for (int i = n.next; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;  // what follows is not coc's
    if (a.rfind("--", 0) != 0) continue;
    a = a.substr(0, a.find('='));
    if (here->get_option_no_throw(a)) continue;
    for (const auto& [other, name] : candidates)
      if (other != here && other->get_option_no_throw(a)) return "; " + a + " is a flag of coc " + name;
  }
  return "";
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

/// CLI11's "The following arguments were not expected: 4096 --foo" lists the words in reverse and splits flags from
/// their values: this names each unknown flag with its values, in command-line order, with "did you mean" when a
/// known flag is close ("arguments were not expected: --tensor-model-paralel-size 2 (did you mean
/// --tensor-model-parallel-size?), --bf16"). "" when the words cannot be told apart (the caller keeps CLI11's).
std::string unexpected_arguments(CLI::App& app, int argc, char** argv) {
  const Named n = deepest_subcommand(app, argc, argv);
  std::vector<std::string> unknown;
  bool in_unknown = false;  // the words after an unknown flag are its values
  size_t skip = 0;          // values of a known option still to skip
  for (int i = n.next; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    const bool flag_like = a.size() > 1 && a[0] == '-' && !is_number(a);
    if (!flag_like) {
      if (skip > 0) --skip;
      else if (in_unknown) unknown.back() += " " + a;
      else unknown.push_back(a);
      continue;
    }
    const std::string name = a.substr(0, a.find('='));
    const bool short_flags = name.size() > 1 && name[1] != '-';  // -v, -vv
    const CLI::Option* opt = n.app->get_option_no_throw(name);
    if (opt || short_flags) {
      in_unknown = false;
      skip = opt && opt->get_type_size() != 0 && name == a ? static_cast<size_t>(opt->get_expected_max()) : 0;
      continue;
    }
    skip = 0;
    in_unknown = true;
    const std::string near = coc::cli::nearest_flag(*n.app, name);
    unknown.push_back(a + (near.empty() ? "" : " (did you mean " + near + "?)"));
  }
  if (unknown.empty()) return "";
  // The hint goes after the flag's values: move it to the end of its entry.
  for (std::string& u : unknown) {
    const size_t open = u.find(" (did you mean ");
    if (open == std::string::npos) continue;
    const size_t close = u.find("?)", open) + 2;
    u = u.substr(0, open) + u.substr(close) + u.substr(open, close - open);
  }
  std::string list;
  for (const std::string& u : unknown) list += (list.empty() ? "" : ", ") + u;
  return fmt::format("coc{}{}: {} not expected: {}", n.path.empty() ? "" : " ", n.path,
                     unknown.size() == 1 ? "argument was" : "arguments were", list);
}

/// CLI11's "Could not convert: --seq-length = --bf16" with what the option takes and, when the value looks like the
/// next flag, that the option's own value is missing. "" for other errors (the caller keeps CLI11's message).
std::string conversion_error(CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  if (!dynamic_cast<const CLI::ConversionError*>(&e)) return "";
  const std::string what = e.what(), prefix = "Could not convert: ";
  const size_t eq = what.find(" = ");
  if (what.rfind(prefix, 0) != 0 || eq == std::string::npos) return "";
  const std::string name = what.substr(prefix.size(), eq - prefix.size()), value = what.substr(eq + 3);
  const CLI::Option* opt = deepest_subcommand(app, argc, argv).app->get_option_no_throw(name);
  if (opt && opt->get_expected_max() == 0)  // a switch given a value: --sequence-parallel=maybe
    return fmt::format("{} is a switch: give it alone to turn it on (or ={{true|false}}), not ='{}'", name, value);
  const std::string type = opt ? opt->get_type_name() : "";
  if (opt && opt->count() > 1 && opt->get_expected_max() == 1) {  // CLI11 reports the values joined: '1,1.5'
    std::string given;
    for (const std::string& v : opt->results()) given += fmt::format("{}'{}'", given.empty() ? "" : ", ", v);
    return fmt::format("{} was given {} times ({}): the last one counts, and '{}' is not one {}", name,
                       opt->count(), given, opt->results().back(), type.empty() ? "value" : type);
  }
  const bool flag_like = value.size() > 1 && value[0] == '-' && !is_number(value);
  return fmt::format("{} takes {}, not '{}'{}", name, type.empty() ? "a value" : "one " + type, value,
                     flag_like ? fmt::format(": give {} a value before {}", name, value) : "");
}

/// Refuses an empty number, and an integer beyond 64 bits, which CLI11 reads as the nearest representable one
/// (`--seq-length 99999999999999999999` became 2^63 − 1, and the errors that followed named other flags, or a check
/// ran for ever). kInvalidArgument naming the option and its limit.
void check_integer_ranges(const CLI::App& app) {
  for (const CLI::App* sub = &app; sub != nullptr;) {
    for (const CLI::Option* opt : sub->get_options()) {
      const std::string type = opt->get_type_name();
      // CLI11 reads an empty number as 0 or as no value at all (`--train-iters ""` trained nothing and said so).
      if (opt->count() > 0 && (type == "INT" || type == "UINT" || type == "FLOAT" || type == "NUMBER"))
        for (const std::string& v : opt->results())
          if (v.empty()) coc::throw_invalid("{} was given an empty value: give it one {}", opt->get_name(), type);
      if (opt->count() == 0 || (type != "INT" && type != "UINT")) continue;
      for (const std::string& v : opt->results()) {
        const char* end = v.data() + v.size();
        std::from_chars_result r;
        if (type == "INT") {
          long long x = 0;
          r = std::from_chars(v.data() + (v.starts_with('+') ? 1 : 0), end, x);
        } else {
          unsigned long long x = 0;
          r = std::from_chars(v.data() + (v.starts_with('+') ? 1 : 0), end, x);
        }
        if (r.ec == std::errc::result_out_of_range)
          coc::throw_invalid("{} {} is out of range: an integer of 64 bits at most ({})", opt->get_name(), v,
                             type == "INT" ? "9223372036854775807" : "18446744073709551615");
      }
    }
    const std::vector<const CLI::App*> parsed = sub->get_subcommands([](const CLI::App* a) { return a->parsed(); });
    sub = parsed.empty() ? nullptr : parsed.front();
  }
}

/// Runs a subcommand that needs no MPI (`coc analyze`): same messages and exit codes as the MPI policy
/// (docs/errors.md), but one process, so an error is simply printed and returned.
int run_without_mpi(CLI::App& app, int argc, char** argv, const coc::cli::Runner& run, const std::string& name) {
  try {
    app.parse(argc, argv);
    check_integer_ranges(app);
    return run();
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::string unexpected =
        dynamic_cast<const CLI::ExtrasError*>(&e) ? unexpected_arguments(app, argc, argv) : std::string();
    if (unexpected.empty()) unexpected = conversion_error(app, argc, argv, e);
    std::fprintf(stderr, "coc: error: %s (see coc %s --help)\n", unexpected.empty() ? e.what() : unexpected.c_str(),
                 name.c_str());
    return 2;
  } catch (const coc::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "coc: error: %s\n", e.what());
    return coc::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "coc: error: %s\n", e.what());
    return 1;
  }
}

/// A launcher of another MPI library starts every rank as its own singleton (world size 1), and each would run the
/// whole job alone and "succeed". The launchers say how many ranks they started (Hydra and Slurm's PMI: PMI_SIZE;
/// Open MPI: OMPI_COMM_WORLD_SIZE); a world of 1 against a launch of more is that mismatch.
void check_launcher(int world_size) {
  for (const coc::env::Var var : {coc::env::Var::kPmiSize, coc::env::Var::kOmpiCommWorldSize}) {
    const std::optional<std::string> v = coc::env::raw(var);
    const int launched = v ? std::atoi(v->c_str()) : 0;
    if (world_size == 1 && launched > 1) {
#if defined(OMPI_MAJOR_VERSION)
      const char* mine = "Open MPI (launch it with mpirun, or scripts/launch / scripts/cluster --mpi openmpi)";
#elif defined(MPICH_VERSION)
      const char* mine = "MPICH (launch it with mpiexec.mpich, or scripts/launch / scripts/cluster --mpi mpich)";
#else
      const char* mine = "another MPI library than the launcher's";
#endif
      coc::throw_invalid("this coc started as a world of 1 rank, but its launcher started {} ({}={}): it was built "
                         "against {}; or run the build that matches the launcher (build/: Open MPI, "
                         "build-mpich/: MPICH)",
                         launched, coc::env::spec(var).name, launched, mine);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"coc: communication over computation. Megatron-style tensor/sequence-parallel training on CPU "
               "clusters over MPI, with collectives hidden behind GEMMs (MindSpeed's CoC, for CPUs)."};
  app.formatter(std::make_shared<HelpFormatter>());  // before the subcommands, which inherit it
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("coc ") + COC_VERSION);
  std::vector<std::pair<std::string, coc::cli::Runner>> cmds;
  cmds.emplace_back("train", coc::cli::add_train_command(app));
  cmds.emplace_back("check", coc::cli::add_check_command(app));
  cmds.emplace_back("env", coc::cli::add_env_command(app));
  cmds.emplace_back("bench", coc::cli::add_bench_command(app));
  cmds.emplace_back("tune", coc::cli::add_tune_command(app));
  cmds.emplace_back("analyze", coc::cli::add_analyze_command(app));
  cmds.emplace_back("plot", coc::cli::add_plot_command(app));
  cmds.emplace_back("preprocess", coc::cli::add_preprocess_command(app));
  cmds.emplace_back("convert", coc::cli::add_convert_command(app));
  // `coc analyze`, `coc plot`, `coc preprocess` and `coc convert` work on files on one process: no MPI_Init, so
  // they run without mpirun, as root, and start at once (a singleton MPI_Init costs ~0.1-1 s and needs the
  // run-as-root variables under Open MPI).
  for (auto& [name, run] : cmds)
    if (argc > 1 && (name == "analyze" || name == "plot" || name == "preprocess" || name == "convert") &&
        name == argv[1])
      return run_without_mpi(app, argc, argv, run, name);
  // Before MPI_Init and before any thread: may re-execute coc with OpenBLAS's kernels chosen for this CPU, when
  // OpenBLAS fell back to its SSE3 ones (coc/kernels/blas_core.h; 4-6x slower GEMMs).
  coc::select_blas_core(argv);

  // The MPI subcommands run training steps, which free and re-allocate the same large buffers (coc/runtime/
  // memory.h); the file tools above keep glibc's defaults, so that their resident memory falls after a phase.
  coc::retain_freed_memory();
  coc::init_mpi(argc, argv);
  coc::retain_freed_memory();  // again: a library MPI_Init loaded may have moved the thresholds
  const int rank = coc::world_rank();
  coc::log::set_rank(rank);

  return coc::run_with_error_policy([&]() -> int {
    check_launcher(coc::world_size());
    if (argc > 1 && argv[1][0] != '-') {
      bool known = false;
      for (auto& [name, run] : cmds) known = known || name == argv[1];
      if (!known)
        coc::throw_invalid("unknown subcommand '{}'; use train, check, env, bench, tune, analyze, plot, "
                           "preprocess or convert (see coc --help)",
                           argv[1]);
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return rank == 0 ? app.exit(e) : 0;  // --help, --version
      // A uniform error: rank 0 prints it once when every rank raised it (the same argv); a rank launched with
      // other flags (MPMD) would otherwise leave the others waiting in the first collective, so the error policy
      // aborts the job then.
      std::string unexpected =
          dynamic_cast<const CLI::ExtrasError*>(&e) ? unexpected_arguments(app, argc, argv) : std::string();
      if (unexpected.empty()) unexpected = conversion_error(app, argc, argv, e);
      throw coc::Error(coc::ErrorKind::kInvalidArgument,
                       fmt::format("{}{} (see coc --help, or coc SUBCOMMAND --help)",
                                   unexpected.empty() ? e.what() : unexpected, other_subcommand_hint(app, argc, argv)),
                       /*uniform=*/true);
    }
    // Every rank must run the same subcommand, or the first collective of each would wait for the other forever
    // (an MPMD launch with mixed commands). Compare before anything else talks.
    std::string sub;
    for (auto& [name, run] : cmds)
      if (app.got_subcommand(name)) sub = name;
    uint64_t h[2] = {coc::fnv1a(sub.data(), sub.size()), 0};
    h[1] = ~h[0];
    MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (h[1] != ~h[0])
      coc::throw_invalid("ranks run different subcommands (this rank: '{}'); launch every rank with the same command",
                         sub);
    check_integer_ranges(app);
    int rc = 0;
    for (auto& [name, run] : cmds)
      if (app.got_subcommand(name)) rc = run();
    return rc;
  });
}
