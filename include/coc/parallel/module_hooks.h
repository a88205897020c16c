// The module hooks of a model made of a list of modules (the decoder's embedding, layers and head): the points
// where a hook runs and its signature. Declared below the model so that parallel/ strategies (sharded data
// parallelism, the overlapped gradient reduction) can offer hooks without knowing the model (Decoder::add_hook
// runs them).
#pragma once

#include <functional>

namespace coc {

/// Where a module hook runs (Decoder::add_hook).
enum class HookPoint { kPreForward, kPostForward, kPreBackward, kPostBackward };
/// A hook receives the module index (0 = embedding, 1..L = layers, L+1 = head).
using ModuleHook = std::function<void(int module)>;
/// Registers a hook at a point of every module (Decoder::add_hook, bound to one model).
using HookRegistrar = std::function<void(HookPoint point, ModuleHook hook)>;

}  // namespace coc
