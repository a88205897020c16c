// A program outside coc that uses the installed library, as a trainer would use MindSpeed's CoC ops: one
// matmul_all_reduce (the row-parallel linear's forward, N = 4 chunks) on T ranks, checked against the same sum
// computed here in plain loops. Built by tests/cli/install_consumer.sh against `cmake --install`'s output, once
// with find_package(coc CONFIG) (CMakeLists.txt beside it) and once with pkg-config.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/comm/progress_engine.h"
#include "coc/overlap/coc_ops.h"

namespace {
// Input and weight values of rank r, the same on every rank so that each can compute the reference.
float a_at(int r, int64_t i, int64_t j) { return static_cast<float>(((i * 7 + j * 3 + r * 5) % 11) - 5) / 8.0f; }
float w_at(int r, int64_t j, int64_t c) { return static_cast<float>(((j * 5 + c * 2 + r * 3) % 13) - 6) / 16.0f; }
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rc = 0;
  {
    auto engine = std::make_shared<coc::ProgressEngine>(coc::EngineKind::kInline, 100);
    coc::Communicator tp(MPI_COMM_WORLD, "tp", engine, coc::CommOptions{});
    const int T = tp.size(), me = tp.rank();
    const int64_t m = 96, k = 40, n = 24;  // k: this rank's slice of the input features
    std::vector<float> a(m * k), w(k * n), out(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) a[i * k + j] = a_at(me, i, j);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t c = 0; c < n; ++c) w[j * n + c] = w_at(me, j, c);
    coc::CocOptions opts;
    opts.parallel_num = 4;
    opts.tag = "consumer";
    coc::matmul_all_reduce(tp, {a.data(), m, k, k}, {w.data(), k, n, n}, coc::WeightLayout::kKN, {out.data(), m, n, n},
                           nullptr, opts);
    double max_err = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < n; ++c) {
        double ref = 0;
        for (int r = 0; r < T; ++r)
          for (int64_t j = 0; j < k; ++j) ref += static_cast<double>(a_at(r, i, j)) * w_at(r, j, c);
        max_err = std::max(max_err, std::fabs(ref - out[i * n + c]));
      }
    rc = max_err < 1e-3 ? 0 : 1;
    std::printf("consumer: rank %d of %d: matmul_all_reduce [%lld x %lld] N=4, max error %.2e: %s\n", me, T,
                static_cast<long long>(m), static_cast<long long>(n), max_err, rc == 0 ? "ok" : "WRONG");
  }
  MPI_Finalize();
  return rc;
}
