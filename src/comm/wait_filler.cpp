#include "coc/comm/wait_filler.h"

namespace coc {

namespace {
thread_local WaitFiller* t_filler = nullptr;
thread_local bool t_in_unit = false;
}  // namespace

WaitFiller::WaitFiller(std::function<bool()> unit) : unit_(std::move(unit)), outer_(t_filler) { t_filler = this; }

WaitFiller::~WaitFiller() { t_filler = outer_; }

bool WaitFiller::run_unit() {
  WaitFiller* f = t_filler;
  if (!f || t_in_unit || f->exhausted_) return false;
  t_in_unit = true;
  struct Reset {
    ~Reset() { t_in_unit = false; }
  } reset;
  if (!f->unit_()) f->exhausted_ = true;
  return !f->exhausted_;
}

}  // namespace coc
