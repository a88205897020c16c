#include "coc/model/checkpoint_reshard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "coc/core/error.h"
#include "coc/model/safetensors.h"

namespace coc {
namespace {

using json = nlohmann::json;

/// The "meta" JSON of a shard's metadata; kInvalidArgument for a shard without its model_config.
json shard_meta(const SafetensorsHeader& h, const std::string& path) {
  const auto m = h.metadata.find("meta");
  json j = m == h.metadata.end() ? json() : json::parse(m->second, nullptr, false);
  if (!j.is_object() || !j.contains("model_config"))
    throw_invalid("{} records no model_config (saved by an older coc); train one more --save with this coc to "
                  "record it",
                  path);
  return j;
}

std::string describe(const PipelineLayout& l) {
  return fmt::format("--pipeline-model-parallel-size {} (layers per virtual stage {})", l.pp,
                     fmt::join(l.layers, ", "));
}

/// Where checkpoint tensor `name` goes in a shard written here: parameters, then first, then second moments (the
/// order coc train writes), each in model order (embedding, layers by index, head); ties keep the source order.
std::pair<int, int64_t> write_order(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const int kind = ends_with(".exp_avg_sq") ? 2 : ends_with(".exp_avg") ? 1 : 0;
  if (name.rfind("embedding", 0) == 0) return {kind, 0};
  if (name.rfind("layers.", 0) == 0) return {kind, 1 + std::atoll(name.c_str() + 7)};
  return {kind, INT64_MAX};
}

/// Every tensor of TP rank `r` and ep rank `e` of `info`'s checkpoint, read stage shard by stage shard through
/// load_shard (CRC and identity checked) into `store`; returns (name, tensor) in source order and sets `meta` to
/// stage 0's meta JSON.
std::vector<std::pair<std::string, Tensor*>> read_rank(const std::string& load_dir, const CheckpointInfo& info, int r,
                                                       int e, std::deque<Tensor>& store, std::string& meta) {
  const std::vector<std::string> paths = checkpoint_stage_paths(load_dir, info, r, e);
  std::vector<std::pair<std::string, Tensor*>> all;
  std::set<std::string> seen;
  for (int s = 0; s < info.layout.pp; ++s) {
    const SafetensorsHeader h = read_safetensors_header(paths[static_cast<size_t>(s)]);
    CheckpointShard in;
    in.config_hash = info.config_hash;
    in.tp_rank = r;
    in.tp_size = info.tp;
    in.dp_rank = checkpoint_stage_field(s, info.ep, e);
    for (const SafetensorsEntry& t : h.tensors) {
      if (!seen.insert(t.name).second)
        throw_invalid("--load-dir {}: tensor '{}' is in two stage shards of TP rank {} (the second: {}); the folder "
                      "mixes checkpoints: keep one run's shards",
                      load_dir, t.name, r, paths[static_cast<size_t>(s)]);
      in.tensors.emplace_back(t.name, &store.emplace_back(t.shape));
    }
    load_shard(load_dir, info.iteration, in);
    if (checkpoint_pipeline_layout(in.meta_json, info.config.num_layers) != info.layout)
      throw_invalid("--load-dir {}: {} records another pipeline layout than the first shard ({}); the folder mixes "
                    "checkpoints: keep one run's shards",
                    load_dir, paths[static_cast<size_t>(s)], describe(info.layout));
    if (s == 0) meta = in.meta_json;
    all.insert(all.end(), in.tensors.begin(), in.tensors.end());
  }
  return all;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& load_dir) {
  const std::optional<int64_t> latest = read_latest(load_dir);
  if (!latest)
    throw_invalid("--load-dir {} has no latest_checkpointed_iteration.txt; pass the --save folder of a coc run",
                  load_dir);
  const std::string first = checkpoint_shard_path(load_dir, *latest, 0, 0);
  std::error_code ec;
  if (!std::filesystem::exists(first, ec))
    throw_invalid("--load-dir {}: {} (TP rank 0, pipeline stage 0) is missing; pass the --save folder of a complete "
                  "coc checkpoint",
                  load_dir, first);
  const SafetensorsHeader h = read_safetensors_header(first);
  const json meta = shard_meta(h, first);
  CheckpointInfo info;
  info.iteration = *latest;
  info.config = model_config_from_json(meta["model_config"].dump());
  info.meta = meta.dump();
  const auto field = [&](const char* key) {
    const auto it = h.metadata.find(key);
    if (it == h.metadata.end())
      throw_invalid("{} has no {} in its metadata: it is not a coc checkpoint shard", first, key);
    return it->second;
  };
  info.config_hash = std::stoull(field("config_hash"));
  info.tp = std::stoi(field("tp_size"));
  info.ep = meta.contains("mesh") && meta["mesh"].is_object() ? meta["mesh"].value("ep", 1) : 1;
  info.layout = checkpoint_pipeline_layout(info.meta, info.config.num_layers);
  int64_t layers = 0;
  for (int n : info.layout.layers) layers += n;
  if (info.layout.pp < 1 || info.layout.layers.size() % static_cast<size_t>(info.layout.pp) != 0 ||
      layers != info.config.num_layers || info.ep < 1 || info.tp < 1)
    throw_invalid("{} records an impossible layout (tp {}, ep {}, {}) for {} layers; it was not written by coc train",
                  first, info.tp, info.ep, describe(info.layout), info.config.num_layers);
  return info;
}

std::vector<std::string> checkpoint_stage_paths(const std::string& load_dir, const CheckpointInfo& info, int tp_rank,
                                                int ep_rank) {
  std::vector<std::string> paths;
  for (int s = 0; s < info.layout.pp; ++s) {
    const int field = checkpoint_stage_field(s, info.ep, ep_rank);
    paths.push_back(checkpoint_shard_path(load_dir, info.iteration, tp_rank, field));
    std::error_code ec;
    if (!std::filesystem::exists(paths.back(), ec))
      throw_invalid("--load-dir {}: {} is missing: the checkpoint was saved with {}{} and that file holds stage {}'s "
                    "tensors of TP rank {}{}; copy every stage's shard of iteration {} into {}",
                    load_dir, paths.back(), describe(info.layout),
                    info.ep > 1 ? fmt::format(" and --expert-model-parallel-size {}", info.ep) : "", s, tp_rank,
                    info.ep > 1 ? fmt::format(", ep rank {}", ep_rank) : "", info.iteration,
                    checkpoint_iteration_dir(load_dir, info.iteration));
  }
  return paths;
}

PipelineLayout target_pipeline_layout(const ModelConfig& c, int pp) {
  const int layers = static_cast<int>(c.num_layers);
  if (pp < 1) throw_invalid("--target-pipeline-parallel-size must be >= 1 (got {})", pp);
  if (pp > layers)
    throw_invalid("--target-pipeline-parallel-size {} exceeds the model's {} layers: every stage holds at least one "
                  "layer; pass at most {}",
                  pp, layers, layers);
  if (layers % pp != 0)
    throw_invalid("--target-pipeline-parallel-size {} does not divide the model's {} layers: coc convert gives every "
                  "stage the same number; pass a divisor of {} (coc train --load reads the checkpoint at any "
                  "--pipeline-model-parallel-size and layer split)",
                  pp, layers, layers);
  return {pp, std::vector<int>(static_cast<size_t>(pp), layers / pp)};
}

std::string checkpoint_meta_for_stage(const std::string& meta_json, const PipelineLayout& layout, int stage) {
  json j = json::parse(meta_json);
  json mesh = j.contains("mesh") && j["mesh"].is_object() ? j["mesh"] : json::object();
  for (const char* key : {"pp", "pp_rank", "pp_layers", "pp_virtual_stages"}) mesh.erase(key);
  if (layout.pp > 1) {
    mesh["pp"] = layout.pp;
    mesh["pp_rank"] = stage;
    mesh["pp_layers"] = layout.layers;
    mesh["pp_virtual_stages"] = static_cast<int>(layout.layers.size()) / layout.pp;
  }
  j["mesh"] = mesh;
  return j.dump();
}

CheckpointInfo reshard_checkpoint_pipeline(const std::string& load_dir, const std::string& save_dir, int pp) {
  const CheckpointInfo info = read_checkpoint_info(load_dir);
  const PipelineLayout to = target_pipeline_layout(info.config, pp);
  for (int r = 0; r < info.tp; ++r) {
    for (int e = 0; e < info.ep; ++e) {
      std::deque<Tensor> store;
      std::string meta;
      std::vector<std::pair<std::string, Tensor*>> all = read_rank(load_dir, info, r, e, store, meta);
      std::stable_sort(all.begin(), all.end(),
                       [](const auto& a, const auto& b) { return write_order(a.first) < write_order(b.first); });
      for (int s = 0; s < to.pp; ++s) {
        CheckpointShard out;
        out.iteration = info.iteration;
        out.config_hash = info.config_hash;
        out.tp_rank = r;
        out.tp_size = info.tp;
        out.dp_rank = checkpoint_stage_field(s, info.ep, e);
        out.meta_json = checkpoint_meta_for_stage(meta, to, s);
        for (const auto& t : all)
          if (checkpoint_stage_of(t.first, to) == s) out.tensors.push_back(t);
        save_shard(save_dir, out);
      }
    }
  }
  write_latest(save_dir, info.iteration);
  return info;
}

}  // namespace coc
