// Waiting for a later rank (docs/analysis.md): how much of a rank's exposed communication it spent in collectives
// that another rank of the group had not posted yet. A collective cannot complete before its last rank posts it, so
// until then the rank waits for that rank's work, not for the link. msprof calls this part of a communication op its
// "Wait Time" (the synchronization before the transfer); HTA has no such figure.
//
// Terms:
//   post(r, c)  the start of collective c's event on rank r (coc traces it from the post, docs/profiling.md)
//   last(c)     max over the group's ranks of post(r, c), and the rank that made it (the late rank)
//   wait(r, c)  [post(r, c), min(last(c), end(r, c))), empty on the late rank itself
//   E_r         rank r's exposed communication (Communication(Not Overlapped)) in the analysed steps
// Steps:
//   1. within one file (one clock, one name table), key each collective by (communicator, group_root, seq);
//   2. last(c) over the ranks that traced c; a collective seen by one rank only (a partial --profile-ranks) is
//      unmatched: its exposed time is neither a wait nor known to follow every post, and is reported apart;
//   3. late_wait(r, step) = |(∪_c wait(r, c)) ∩ E_r ∩ step|; the same over the c of each op (comm_ops' rows), and
//      over the c whose last rank is q, per q: the largest names the rank r waited for most.
// The ranks' clocks are aligned by the trace writer (comm/clock_sync.h: within half a round trip), so waits
// shorter than that are noise; they add up to little.
#include <fmt/format.h>

#include <map>
#include <utility>

#include "metrics.h"

namespace coc::analysis::detail {

namespace {

using Key = std::pair<uint32_t, int64_t>;  // (communicator name id, collective key)

struct Last {
  int64_t ts = 0;
  int rank = -1;
  int ranks = 0;  // how many ranks traced it
};

std::map<Key, Last> last_posts(const std::vector<RankReport*>& ranks) {
  std::map<Key, Last> last;
  for (const RankReport* r : ranks)
    for (const RankReport::CollectivePost& p : r->posts) {
      Last& l = last[{p.group, p.collective}];
      if (l.ranks++ == 0 || p.ts > l.ts) l.ts = p.ts, l.rank = r->rank;
    }
  return last;
}

// The windows the per-operation rows cover (comm_ops: the steps, or the total without steps).
IntervalSet op_windows(const RankReport& r) {
  std::vector<Interval> ws;
  for (const StepReport& s : r.steps) ws.push_back({s.begin_ns, s.end_ns});
  if (ws.empty()) ws.push_back({r.total.begin_ns, r.total.end_ns});
  return IntervalSet::from_union(std::move(ws));
}

void fill_rank(RankReport& r, const std::map<Key, Last>& last) {
  std::map<int, std::vector<Interval>> by_late_rank, by_op_row;
  std::vector<Interval> all, unmatched;
  size_t matched = 0;
  for (const RankReport::CollectivePost& p : r.posts) {
    const Last& l = last.at({p.group, p.collective});
    if (l.ranks < 2) {
      unmatched.push_back({p.ts, p.end});
      continue;
    }
    ++matched;
    if (l.rank == r.rank || l.ts <= p.ts) continue;
    const Interval w{p.ts, std::min(l.ts, p.end)};
    by_late_rank[l.rank].push_back(w);
    if (p.op_row >= 0) by_op_row[p.op_row].push_back(w);
    all.push_back(w);
  }
  if (matched == 0) {
    r.notes.push_back(fmt::format("the waits for a later rank are unknown: none of this rank's {} collectives appears "
                                  "on another rank of the file (a partial --profile-ranks, or edited keys)",
                                  r.posts.size()));
    return;
  }
  const IntervalSet exposed = IntervalSet::from_union(std::move(r.exposed_parts));
  const IntervalSet late = IntervalSet::from_union(std::move(all)).intersect(exposed);
  for (StepReport& s : r.steps) s.late_wait_ns = late.clip({s.begin_ns, s.end_ns}).measure();
  const Interval total{r.total.begin_ns, r.total.end_ns};
  r.total.late_wait_ns = late.clip(total).measure();
  const IntervalSet unmatched_exposed = IntervalSet::from_union(std::move(unmatched)).intersect(exposed);
  r.unmatched_ns = unmatched_exposed.subtract(late).clip(total).measure();
  // An op's waits lie inside its own collectives, so their exposed part (in the op rows' windows) is their part of
  // the op's exposed time.
  const IntervalSet op_exposed = exposed.intersect(op_windows(r));
  for (CommOpStat& o : r.comm_ops) o.late_wait_ns = 0;
  for (auto& [row, ivs] : by_op_row) {
    CommOpStat& o = r.comm_ops[static_cast<size_t>(row)];
    o.late_wait_ns = IntervalSet::from_union(std::move(ivs)).intersect(op_exposed).measure();
  }
  for (auto& [q, ivs] : by_late_rank) {
    const int64_t ns = IntervalSet::from_union(std::move(ivs)).intersect(exposed).clip(total).measure();
    if (ns > r.waited_for_ns) r.waited_for_rank = q, r.waited_for_ns = ns;
  }
}

}  // namespace

void fill_late_waits(std::vector<RankReport>& ranks) {
  std::map<std::string, std::vector<RankReport*>> by_file;
  for (RankReport& r : ranks)
    if (r.format == TraceFormat::kCoc && r.rank >= 0 && !r.posts.empty()) by_file[r.file].push_back(&r);
  for (auto& [file, rs] : by_file) {
    if (rs.size() < 2) {
      if (rs[0]->world_size > 1)  // a run of one rank has no one to wait for: nothing to say
        rs[0]->notes.push_back(
            fmt::format("the waits for a later rank are unknown: this file holds rank {} alone, and collectives are "
                        "matched between the ranks of one file (coc train --profile writes them all into one)",
                        rs[0]->rank));
      continue;
    }
    const std::map<Key, Last> last = last_posts(rs);
    for (RankReport* r : rs) fill_rank(*r, last);
  }
  for (RankReport& r : ranks) {  // inputs only: free them
    std::vector<RankReport::CollectivePost>().swap(r.posts);
    std::vector<Interval>().swap(r.exposed_parts);
  }
}

}  // namespace coc::analysis::detail
