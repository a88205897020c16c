// coc-test-np: 1 2 3
// The MPI process queries (coc/comm/process.h) on real ranks: world size and rank, the library's identity, the
// thread level, this rank's place on its node, MPI_T control variables. abort_job ends the job, so
// tests/cli/rank_failure.sh covers it end to end.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "coc/comm/communicator.h"
#include "coc/comm/process.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

TEST(Process, WorldSizeAndRankMatchAWorldCommunicator) {
  auto world = test::world_comm();
  EXPECT_EQ(world_size(), world->size());
  EXPECT_EQ(world_rank(), world->rank());
  EXPECT_EQ(world_rank(), world_rank()) << "constant";
}

TEST(Process, LibraryIdentity) {
  const std::string lib = library_version();
  ASSERT_FALSE(lib.empty());
  EXPECT_NE(lib.back(), '\n');
  EXPECT_NE(lib.back(), ' ');
  EXPECT_NE(mpi_vendor(lib), "unknown") << lib;
  EXPECT_TRUE(std::regex_match(standard_version(), std::regex("[0-9]+\\.[0-9]+"))) << standard_version();
  EXPECT_FALSE(processor_name().empty());
}

TEST(Process, VendorFromLibraryText) {
  EXPECT_EQ(mpi_vendor("Open MPI v4.1.4, package: Debian OpenMPI"), "Open MPI");
  EXPECT_EQ(mpi_vendor("MPICH Version:\t4.0.2\nMPICH Release date: ..."), "MPICH");
  EXPECT_EQ(mpi_vendor("MVAPICH2 Version      :\t2.3.7"), "MVAPICH");
  EXPECT_EQ(mpi_vendor("Intel(R) MPI Library 2021.9 for Linux* OS"), "Intel MPI");
  EXPECT_EQ(mpi_vendor("some other MPI"), "unknown");
}

TEST(Process, ThreadLevelGrantedAndNamed) {
  // coc's entry points ask for SERIALIZED; Debian's Open MPI and MPICH grant at least that.
  EXPECT_GE(thread_level(), kThreadLevelRequested) << to_string(thread_level());
  EXPECT_EQ(to_string(ThreadLevel::kSingle), "MPI_THREAD_SINGLE");
  EXPECT_EQ(to_string(ThreadLevel::kFunneled), "MPI_THREAD_FUNNELED");
  EXPECT_EQ(to_string(ThreadLevel::kSerialized), "MPI_THREAD_SERIALIZED");
  EXPECT_EQ(to_string(ThreadLevel::kMultiple), "MPI_THREAD_MULTIPLE");
}

TEST(Process, NodePlacementAgreesWithTheHostNames) {
  const NodePlacement p = node_placement();
  ASSERT_GE(p.local_size, 1);
  EXPECT_GE(p.local_rank, 0);
  EXPECT_LT(p.local_rank, p.local_size);
  // The ranks with this rank's host name are its node; its local rank counts those below it.
  auto world = test::world_comm();
  const std::string host = processor_name();
  std::string joined;  // every rank's host name, one a line, in rank order
  for (const auto& h : world->gather_bytes(host, 0, "hosts")) joined += h + '\n';
  const std::string all = world->broadcast_string(joined, 0, "hosts");
  int same = 0, below = 0, r = 0;
  for (size_t at = 0, nl; (nl = all.find('\n', at)) != std::string::npos; at = nl + 1, ++r)
    if (all.substr(at, nl - at) == host) {
      ++same;
      below += r < world_rank() ? 1 : 0;
    }
  EXPECT_EQ(p.local_size, same);
  EXPECT_EQ(p.local_rank, below);
}

TEST(Process, ControlVariables) {
  EXPECT_TRUE(control_variables({}).empty());
  // One value per name, in order, whatever is missing around it. Open MPI exposes its TCP interface lists as string
  // variables; other libraries may have none of that name.
  const auto v = control_variables({"coc_no_such_control_variable", "btl_tcp_if_exclude", "coc_no_such_either"});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_FALSE(v[0].has_value());
  EXPECT_FALSE(v[2].has_value());
  if (mpi_vendor(library_version()) == "Open MPI") EXPECT_TRUE(v[1].has_value());
  // A second session reads the same.
  EXPECT_EQ(control_variables({"btl_tcp_if_exclude"})[0], v[1]);
}

}  // namespace
}  // namespace coc
