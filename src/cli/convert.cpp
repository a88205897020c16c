// `coc convert`: Hugging Face LLaMA folders ⇄ coc checkpoints (model/hf_convert.h) and coc checkpoints re-cut for
// another pipeline layout (model/checkpoint_reshard.h), with the flag names of Megatron's
// tools/checkpoint/convert.py (--loader, --saver, --load-dir, --save-dir, --target-tensor-parallel-size,
// --target-pipeline-parallel-size; as there, a target size not given is 1 from hf and the checkpoint's from coc).
// One process, no MPI (main runs it without MPI_Init).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "coc/core/dtype.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/model/checkpoint_reshard.h"
#include "coc/model/hf_convert.h"
#include "coc/model/safetensors.h"

namespace coc::cli {
namespace {

struct ConvertOptions {
  std::string loader, saver, load_dir, save_dir;
  std::string hf_dtype;  ///< empty: not given (fp32 for --saver hf)
  int tp = 1, pp = 1;    ///< --target-tensor/pipeline-parallel-size
  bool tp_given = false, pp_given = false;
  bool force = false;
};

/// "1 pipeline stage", "2 pipeline stages".
std::string count_of(int n, const char* noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

/// A conversion writes over what --save-dir holds: refuse a folder that has files in it unless --force says so.
void check_save_dir(const ConvertOptions& o) {
  std::error_code ec;
  if (o.force || !std::filesystem::exists(o.save_dir, ec)) return;
  if (!std::filesystem::is_directory(o.save_dir, ec))
    throw_invalid("--save-dir {}: a file of that name exists; pass a folder", o.save_dir);
  if (!std::filesystem::is_empty(o.save_dir, ec))
    throw_invalid("--save-dir {}: the folder already holds files (a checkpoint or a model?); pass a new folder, or "
                  "--force to write over it",
                  o.save_dir);
}

/// --loader coc --saver coc: the checkpoint re-cut at --target-pipeline-parallel-size stages (default: as saved),
/// tp as saved (refused otherwise: re-splitting tp would need the Adam moments re-split too).
int reshard_coc(const ConvertOptions& o) {
  const CheckpointInfo info = read_checkpoint_info(o.load_dir);
  if (o.tp_given && o.tp != info.tp)
    throw_invalid("--target-tensor-parallel-size {}: --loader coc --saver coc re-cuts pipeline stages only and "
                  "{} was saved with --tensor-model-parallel-size {}; drop the flag or pass {} (convert to hf and "
                  "back to change tp, with fresh Adam moments)",
                  o.tp, o.load_dir, info.tp, info.tp);
  std::error_code ec;
  if (std::filesystem::equivalent(o.load_dir, o.save_dir, ec))
    throw_invalid("--save-dir {} is --load-dir: coc convert writes a new checkpoint next to the one it reads; pass "
                  "another --save-dir",
                  o.save_dir);
  check_save_dir(o);
  const int pp = o.pp_given ? o.pp : info.layout.pp;
  reshard_checkpoint_pipeline(o.load_dir, o.save_dir, pp);
  std::printf("coc convert: %s -> %s (iteration %lld, %s, %d -> %s%s)\nresume with: coc "
              "train --load %s --tensor-model-parallel-size %d --pipeline-model-parallel-size %d and the flags of "
              "the run that saved it\n",
              o.load_dir.c_str(), o.save_dir.c_str(), static_cast<long long>(info.iteration),
              count_of(info.tp, "tp shard").c_str(), info.layout.pp, count_of(pp, "pipeline stage").c_str(),
              info.ep > 1 ? fmt::format(", {} ep ranks", info.ep).c_str() : "", o.save_dir.c_str(), info.tp, pp);
  return 0;
}

int run_convert(const ConvertOptions& o) {
  // coc convert does not bring MPI up; under a launcher every process would write the same files at once.
  for (const env::Var var : {env::Var::kOmpiCommWorldSize, env::Var::kPmiSize})
    if (const std::optional<std::string> n = env::raw(var); n && std::atoi(n->c_str()) > 1)
      throw_invalid("coc convert runs in one process, not in each of {} ranks: run build/bin/coc convert without "
                    "scripts/launch or mpirun",
                    *n);
  // Checked before --save-dir so that a wrong flag is named as itself, not as a folder that holds files.
  if (!o.hf_dtype.empty() && o.saver == "coc")
    throw_invalid("--hf-dtype {} applies to --saver hf only: a coc checkpoint holds the fp32 master weights (so a "
                  "--bf16 run resumes bit for bit); drop --hf-dtype",
                  o.hf_dtype);
  if (o.saver == "hf" && (o.tp_given || o.pp_given))
    throw_invalid("--target-{}-parallel-size {} shapes a coc checkpoint (--saver coc); a Hugging Face folder holds "
                  "the whole model: drop it",
                  o.tp_given ? "tensor" : "pipeline", o.tp_given ? o.tp : o.pp);
  const DType hf_dtype = o.hf_dtype.empty() ? DType::kF32 : parse_dtype(o.hf_dtype, "--hf-dtype");
  if (o.loader == "coc" && o.saver == "coc") return reshard_coc(o);
  check_save_dir(o);
  if (o.loader == "hf" && o.saver == "coc") {
    const ModelConfig c = convert_hf_to_coc(o.load_dir, o.save_dir, o.tp, o.pp);
    const std::string pp_flag = o.pp > 1 ? fmt::format(" --pipeline-model-parallel-size {}", o.pp) : "";
    std::printf("coc convert: %s -> %s (%s, %s, iteration 0)\nfine-tune with: coc train "
                "--load %s --tensor-model-parallel-size %d%s %s --norm-epsilon %g --rotary-base %g and a tokenizer "
                "of %lld tokens\n",
                o.load_dir.c_str(), o.save_dir.c_str(), count_of(o.tp, "tp shard").c_str(),
                count_of(o.pp, "pipeline stage").c_str(), o.save_dir.c_str(), o.tp, pp_flag.c_str(),
                c.shape_flags().c_str(), static_cast<double>(c.norm_epsilon), static_cast<double>(c.rotary_base),
                static_cast<long long>(c.vocab_size));
    return 0;
  }
  if (o.loader == "coc" && o.saver == "hf") {
    const ModelConfig c = convert_coc_to_hf(o.load_dir, o.save_dir, hf_dtype);
    std::printf("coc convert: %s -> %s (Hugging Face LLaMA, %lld layers, %s)\n", o.load_dir.c_str(),
                o.save_dir.c_str(), static_cast<long long>(c.num_layers), safetensors_dtype_name(hf_dtype));
    return 0;
  }
  throw_invalid("coc convert goes --loader hf --saver coc, --loader coc --saver hf or --loader coc --saver coc (got "
                "--loader {} --saver {})",
                o.loader, o.saver);
}

}  // namespace

Runner add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a Hugging Face LLaMA model (config.json + safetensors) to a "
                                                "coc checkpoint at any tp and pp, a coc checkpoint saved at any tp, "
                                                "pp and V back, or a coc checkpoint to another pp");
  cmd->add_option("--loader", o->loader, "Source format: hf or coc")->required();
  cmd->add_option("--saver", o->saver, "Target format: coc or hf")->required();
  cmd->add_option("--load-dir", o->load_dir, "Source folder")->required();
  cmd->add_option("--save-dir", o->save_dir, "Target folder")->required();
  CLI::Option* tp = cmd->add_option("--target-tensor-parallel-size", o->tp,
                  "TP shards of the coc checkpoint written from hf (default 1); from coc, only the checkpoint's own "
                  "tp is accepted");
  CLI::Option* pp = cmd->add_option("--target-pipeline-parallel-size", o->pp,
                  "Pipeline stages of the coc checkpoint written (--saver coc; default 1 from hf, the checkpoint's "
                  "from coc): num_layers / P layers each, one shard per stage as coc train --save writes them (coc "
                  "train --load reads it at any --pipeline-model-parallel-size). From coc: every tensor, the Adam "
                  "moments and the iteration move unchanged, so the run resumes bit for bit (MoE models at any ep "
                  "too). Reading from coc merges the stages of a checkpoint saved at any pp, layer split and V");
  cmd->add_option("--hf-dtype", o->hf_dtype,
                  "Element type of the Hugging Face tensors written by --saver hf: fp32 (default), bf16 or fp16 (also "
                  "float32, bfloat16, float16), rounded to nearest even from the fp32 master weights; config.json's "
                  "torch_dtype matches. Refused with --saver coc (checkpoints keep fp32)");
  cmd->add_flag("--force", o->force, "Write into a --save-dir that already holds files (refused without it)");
  return [o, tp, pp] {
    o->tp_given = tp->count() > 0;
    o->pp_given = pp->count() > 0;
    return run_convert(*o);
  };
}

}  // namespace coc::cli
