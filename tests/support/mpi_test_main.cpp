// GoogleTest main for tests that run as real MPI ranks (never a mocked MPI).
//
// Every rank runs every test. Only rank 0 prints the normal GoogleTest output; other ranks print only their
// failures, prefixed by the rank. At the end the ranks agree (MPI_Allreduce, MAX) on whether any failed, so a test
// that passes on rank 0 while another rank fails still fails the job (docs/design.md, "Outside the layers").
#include <gtest/gtest.h>
#include <mpi.h>

#include "coc/comm/process.h"
#include "coc/core/log.h"
#include "coc/kernels/blas_core.h"
#include "coc/kernels/gemm.h"

namespace {
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
              r.summary());
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed())
      fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  coc::select_blas_core(argv);  // as coc itself does: OpenBLAS's SSE3 fallback would make these tests 4-6x slower
  coc::init_mpi(argc, argv);
  const int rank = coc::world_rank();
  coc::log::set_rank(rank);
  coc::log::set_level(0);
  coc::set_blas_threads(1);
  testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) fprintf(stderr, "a test failed on another rank (see [rank N] lines)\n");
  MPI_Finalize();
  return any_failed;
}
