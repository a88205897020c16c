#include "coc/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace coc::log {
namespace {
std::atomic<int> g_level{1};
std::atomic<int> g_rank{-1};
std::mutex g_mu;
}  // namespace

void set_level(int l) { g_level.store(l, std::memory_order_relaxed); }
int level() { return g_level.load(std::memory_order_relaxed); }
void set_rank(int r) { g_rank.store(r, std::memory_order_relaxed); }
int rank() { return g_rank.load(std::memory_order_relaxed); }

void write(int, const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_mu);
  int r = rank();
  if (r >= 0)
    std::fprintf(stderr, "[rank %d] %s\n", r, msg.c_str());
  else
    std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
}

}  // namespace coc::log
