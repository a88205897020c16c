// The MoE flags (cli/moe_options.h).
#include "cli/moe_options.h"

#include "coc/core/error.h"

namespace coc::cli {

std::string MoeOptions::given() const {
  for (const CLI::Option* opt : all)
    if (opt->count() > 0) return opt->get_name();
  return "";
}

void add_moe_flags(CLI::App* cmd, MoeOptions& o) {
  const std::string g = "Mixture of experts";
  const size_t before = cmd->get_options().size();
  cmd->add_option("--num-experts", o.num_experts,
                                   "Experts per MoE layer (E); coc train: turns the MLPs into MoE layers (default: "
                                   "the model preset's, 0 for tiny; coc check --layer moe: 4)")
                      ->group(g);
  cmd->add_option("--moe-router-topk", o.topk, "Experts per token (K <= E; default 2)")->group(g);
  cmd->add_option("--moe-ffn-hidden-size", o.ffn_hidden,
                              "Each expert's SwiGLU width (coc train; default: the preset's, else --ffn-hidden-size)")
                  ->group(g);
  cmd->add_option("--moe-layer-freq", o.layer_freq,
                               "coc train: layer i has a MoE MLP when i % freq == 0 (default 1: every layer)")
                   ->group(g);
  cmd->add_option("--first-k-dense-replace", o.first_k_dense,
                  "coc train: layers 0 .. K-1 keep a dense MLP, MoE from layer K on (MindSpeed-LLM's; default 0)")
      ->group(g);
  cmd->add_option("--expert-model-parallel-size,--ep", o.ep,
                  "Expert-parallel size EP (divides E and the data × context-parallel ranks)")
      ->group(g)->capture_default_str();
  o.capacity_opt = cmd->add_option("--moe-expert-capacity-factor", o.capacity_factor,
                                   "Per-expert capacity as a multiple of T·K/E; tokens beyond it are dropped "
                                   "(Megatron's probs policy). Default: no dropping")
                       ->group(g);
  cmd->add_option("--moe-aux-loss-coeff", o.aux_loss_coeff, "Load-balancing loss coefficient")
      ->group(g)->capture_default_str();
  cmd->add_option("--ep-dispatcher", o.dispatcher,
                  "Token dispatcher: eager (all-to-all, sort, grouped GEMM), fused (exchange in place) or mc2 "
                  "(all-to-all pipelined with the grouped GEMM; coc's default: the bits of eager under "
                  "--deterministic, and faster where measured)")
      ->group(g)->capture_default_str();
  cmd->add_option("--moe-mc2-chunks", o.mc2_chunks, "mc2: row chunks per source rank and local expert")
      ->group(g)->capture_default_str();
  cmd->add_option("--moe-fixed-router", o.fixed_router,
                  "Debug: force the routing: none, balanced, skewed (90% of tokens to expert 0) or empty (only the "
                  "first max(K, E/2) experts get tokens)")
      ->group(g)->capture_default_str();
  const std::vector<CLI::Option*> opts = cmd->get_options();
  o.all.assign(opts.begin() + static_cast<std::ptrdiff_t>(before), opts.end());
}

MoeConfig MoeOptions::settings(bool deterministic) const {
  MoeConfig c;
  if (capacity_opt && capacity_opt->count() > 0 && !(capacity_factor > 0))
    throw_invalid("--moe-expert-capacity-factor {} must be > 0 (leave it out for no token dropping)",
                  capacity_factor);
  c.capacity_factor = capacity_factor;
  c.aux_loss_coeff = aux_loss_coeff;
  if (!(aux_loss_coeff >= 0)) throw_invalid("--moe-aux-loss-coeff {} must be >= 0", aux_loss_coeff);
  c.dispatcher = parse_moe_dispatcher(dispatcher);
  c.mc2_chunks = mc2_chunks;
  if (fixed_router == "none") c.fixed_router = RouterPattern::kNone;
  else if (fixed_router == "balanced") c.fixed_router = RouterPattern::kBalanced;
  else if (fixed_router == "skewed") c.fixed_router = RouterPattern::kSkewed;
  else if (fixed_router == "empty") c.fixed_router = RouterPattern::kEmpty;
  else throw_invalid("--moe-fixed-router {}: use none, balanced, skewed or empty", fixed_router);
  c.deterministic = deterministic;
  if (ep < 1) throw_invalid("--expert-model-parallel-size must be >= 1 (got {})", ep);
  return c;
}

MoeConfig MoeOptions::config(int64_t hidden, int64_t ffn_hidden, bool deterministic) const {
  MoeConfig c = settings(deterministic);
  c.hidden = hidden;
  c.ffn_hidden = ffn_hidden;
  c.num_experts = num_experts == kNotGiven ? 4 : num_experts;
  c.topk = topk == kNotGiven ? 2 : topk;
  check_moe_config(c, ep);
  return c;
}

}  // namespace coc::cli
