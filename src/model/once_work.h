// Work over items [0, n) (attention's query blocks, SwiGLU's rows) that several consumers may ask for in any order,
// each item computed once: a CoC op's producer asks for the ranges its chunks read (CocOptions::produce_rows), a
// WaitFiller (comm/wait_filler.h) takes the next unit while another micro-batch's transfer flies, and finish()
// computes what is left. The items are independent, so the order does not change the bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace coc {

class OnceWork {
 public:
  /// compute(b, e) computes items [b, e); `unit` >= 1: the items next_unit() computes at most.
  OnceWork(int64_t n, int64_t unit, std::function<void(int64_t, int64_t)> compute)
      : done_(static_cast<size_t>(n), 0), unit_(unit), compute_(std::move(compute)) {}

  int64_t size() const { return static_cast<int64_t>(done_.size()); }

  /// Computes the items of [first, end) not computed yet, in as few calls as possible.
  void range(int64_t first, int64_t end) {
    for (int64_t b = first; b < end;) {
      if (done_[static_cast<size_t>(b)]) {
        ++b;
        continue;
      }
      int64_t e = b;
      while (e < end && !done_[static_cast<size_t>(e)]) done_[static_cast<size_t>(e++)] = 1;
      compute_(b, e);
      b = e;
    }
  }

  /// Computes up to `unit` items from the first one not computed yet; false when every item is computed.
  bool next_unit() {
    while (next_ < size() && done_[static_cast<size_t>(next_)]) ++next_;
    if (next_ == size()) return false;
    range(next_, std::min(size(), next_ + unit_));
    return true;
  }

  void finish() { range(0, size()); }

 private:
  std::vector<char> done_;
  int64_t unit_;
  int64_t next_ = 0;
  std::function<void(int64_t, int64_t)> compute_;
};

}  // namespace coc
