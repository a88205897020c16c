// `coc convert`: Hugging Face LLaMA folders ⇄ coc checkpoints (model/hf_convert.h), with the flag names of
// Megatron's tools/checkpoint/convert.py (--loader, --saver, --load-dir, --save-dir, --target-tensor-parallel-size).
// One process, no MPI (main runs it without MPI_Init).
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "coc/core/dtype.h"
#include "coc/core/error.h"
#include "coc/model/hf_convert.h"
#include "coc/model/safetensors.h"

namespace coc::cli {
namespace {

struct ConvertOptions {
  std::string loader, saver, load_dir, save_dir;
  std::string hf_dtype;  ///< empty: not given (fp32 for --saver hf)
  int tp = 1;
  bool force = false;
};

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

int run_convert(const ConvertOptions& o) {
  // Checked before --save-dir so that a wrong flag is named as itself, not as a folder that holds files.
  if (!o.hf_dtype.empty() && o.saver == "coc")
    throw_invalid("--hf-dtype {} applies to --saver hf only: a coc checkpoint holds the fp32 master weights (so a "
                  "--bf16 run resumes bit for bit); drop --hf-dtype",
                  o.hf_dtype);
  const DType hf_dtype = o.hf_dtype.empty() ? DType::kF32 : parse_dtype(o.hf_dtype, "--hf-dtype");
  check_save_dir(o);
  if (o.loader == "hf" && o.saver == "coc") {
    const ModelConfig c = convert_hf_to_coc(o.load_dir, o.save_dir, o.tp);
    std::printf("coc convert: %s -> %s (%d tp shards, iteration 0)\nfine-tune with: coc train --load %s "
                "--tensor-model-parallel-size %d %s --norm-epsilon %g --rotary-base %g and a tokenizer of %lld tokens\n",
                o.load_dir.c_str(), o.save_dir.c_str(), o.tp, o.save_dir.c_str(), o.tp, c.shape_flags().c_str(),
                static_cast<double>(c.norm_epsilon), static_cast<double>(c.rotary_base),
                static_cast<long long>(c.vocab_size));
    return 0;
  }
  if (o.loader == "coc" && o.saver == "hf") {
    const ModelConfig c = convert_coc_to_hf(o.load_dir, o.save_dir, hf_dtype);
    std::printf("coc convert: %s -> %s (Hugging Face LLaMA, %lld layers, %s)\n", o.load_dir.c_str(),
                o.save_dir.c_str(), static_cast<long long>(c.num_layers), safetensors_dtype_name(hf_dtype));
    return 0;
  }
  throw_invalid("coc convert goes --loader hf --saver coc or --loader coc --saver hf (got --loader {} --saver {})",
                o.loader, o.saver);
}

}  // namespace

Runner add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a Hugging Face LLaMA model (config.json + safetensors) to a "
                                                "coc checkpoint at any tp, and back");
  cmd->add_option("--loader", o->loader, "Source format: hf or coc")->required();
  cmd->add_option("--saver", o->saver, "Target format: coc or hf")->required();
  cmd->add_option("--load-dir", o->load_dir, "Source folder")->required();
  cmd->add_option("--save-dir", o->save_dir, "Target folder")->required();
  cmd->add_option("--target-tensor-parallel-size", o->tp, "TP shards of the coc checkpoint (hf -> coc)")
      ->capture_default_str();
  cmd->add_option("--hf-dtype", o->hf_dtype,
                  "Element type of the Hugging Face tensors written by --saver hf: fp32 (default), bf16 or fp16 (also "
                  "float32, bfloat16, float16), rounded to nearest even from the fp32 master weights; config.json's "
                  "torch_dtype matches. Refused with --saver coc (checkpoints keep fp32)");
  cmd->add_flag("--force", o->force, "Write into a --save-dir that already holds files (refused without it)");
  return [o] { return run_convert(*o); };
}

}  // namespace coc::cli
