// Compute that fills a thread's waits for transfers (coc's own, beyond Megatron and MindSpeed).
//
// A wait for a posted op (Work::wait, so CocPending::wait and every CoC schedule's wait) has nothing to compute: the
// op it waits for feeds the next GEMM. Another micro-batch has: --overlap-forward-micro-batches runs one
// micro-batch's attention and SwiGLU while the other's TP transfers are in flight (TransformerLayer::forward_pair).
// A WaitFiller hands such work to the waits of its thread, one unit at a time:
//   1. a wait finds its op not done and a filler installed on its thread;
//   2. it runs one unit (about a millisecond of compute), lets the inline engine test the ops in flight, and
//      checks its op again;
//   3. it stops running units when the op is done or the filler has nothing left, and then waits as before.
// A unit must not wait for a transfer itself: a wait inside a unit runs no unit. The innermost of nested fillers
// serves; the one it hides serves again once it is gone. Per thread: the progress engine's own thread runs none.
#pragma once

#include <functional>

namespace coc {

class WaitFiller {
 public:
  /// `unit` runs one piece of work and returns true, or returns false when nothing is left (then it is not called
  /// again by this filler). It must outlive the filler, which installs itself on the calling thread.
  explicit WaitFiller(std::function<bool()> unit);
  ~WaitFiller();
  WaitFiller(const WaitFiller&) = delete;
  WaitFiller& operator=(const WaitFiller&) = delete;

  /// Runs one unit of this thread's innermost filler. False, running nothing, when there is no filler, when called
  /// from inside a unit, or when the filler has nothing left. A unit's exception propagates (the filler stays).
  static bool run_unit();

 private:
  std::function<bool()> unit_;
  WaitFiller* outer_;
  bool exhausted_ = false;
};

}  // namespace coc
