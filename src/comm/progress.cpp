#include "coc/comm/progress.h"

#include "coc/comm/communicator.h"

namespace coc {

void progress(const Communicator& group) { group.engine()->poll(); }

void progress_during(const Communicator& group, const std::function<void()>& compute) {
  group.engine()->poll_during(compute);
}

std::unique_ptr<ProgressLease> lend_progress(const Communicator& group) { return group.engine()->lend_poller(); }

bool progresses_in_background(const Communicator& group) { return group.engine()->kind() == EngineKind::kThread; }

}  // namespace coc
