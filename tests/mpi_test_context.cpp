// The per-rank context under mpiexec: topology (hosts, emulated nodes), the rank → device mapping, and
// buffers on the device each rank drives.
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <vector>

#include "src/context.h"
#include "kernels/fill.h"
#include "tests/testing.h"

using namespace sparta;

BOOST_AUTO_TEST_CASE(topology_one_node_per_host) {
  Topology t = make_topology(MPI_COMM_WORLD, 0);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  BOOST_CHECK_EQUAL(t.size, size);
  // mpiexec on one machine puts every rank on one host.
  BOOST_CHECK_EQUAL(t.num_nodes, 1);
  BOOST_CHECK_EQUAL(t.local_size, size);
  BOOST_CHECK_EQUAL(t.local_rank, t.rank);
  BOOST_CHECK_EQUAL(t.host_rank, t.rank);
  BOOST_CHECK(t.uniform);
  free_topology(t);
}

BOOST_AUTO_TEST_CASE(topology_emulated_nodes) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int k : {1, 2, 3}) {
    Topology t = make_topology(MPI_COMM_WORLD, k);
    BOOST_CHECK_EQUAL(t.num_nodes, (size + k - 1) / k);
    BOOST_CHECK_EQUAL(t.node, t.rank / k);
    BOOST_CHECK_EQUAL(t.local_rank, t.rank % k);
    BOOST_CHECK_EQUAL(t.local_size, std::min(k, size - t.node * k));
    BOOST_CHECK_EQUAL(t.uniform, size % k == 0 || size < k);
    int cross_size = 0, cross_rank = 0;
    MPI_Comm_size(t.cross_comm, &cross_size);
    MPI_Comm_rank(t.cross_comm, &cross_rank);
    BOOST_CHECK_EQUAL(cross_rank, t.node);  // ordered by node
    BOOST_CHECK_EQUAL(cross_size, size / k + (t.local_rank < size % k ? 1 : 0));
    // The host stays one host: the device mapping never follows emulated nodes.
    BOOST_CHECK_EQUAL(t.host_rank, t.rank);
    free_topology(t);
  }
  Topology bad;
  BOOST_CHECK_THROW(bad = make_topology(MPI_COMM_WORLD, -1), Error);
}

BOOST_AUTO_TEST_CASE(context_on_cpu) {
  ContextOptions o;
  o.device = "cpu";
  Context ctx(o);
  BOOST_CHECK(!ctx.device().is_cuda());
  std::string d = ctx.describe();
  if (ctx.is_root()) BOOST_CHECK(d.find("device cpu") != std::string::npos);
  else BOOST_CHECK(d.empty());
}

BOOST_AUTO_TEST_CASE(context_auto_maps_local_rank_to_gpu) {
  Context ctx;  // --device auto
  int gpus = visible_gpu_count();
  const Topology& t = ctx.topo();
  if (gpus >= t.host_size && gpus > 0) {
    BOOST_CHECK(ctx.device().is_cuda());
    BOOST_CHECK_EQUAL(ctx.device().gpu, t.host_rank);
    // Every rank on a host drives a different GPU.
    std::vector<int> all(t.host_size);
    int mine = ctx.device().gpu;
    MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, t.host_comm);
    for (int r = 0; r < t.host_size; ++r) BOOST_CHECK_EQUAL(all[r], r);
  } else {
    BOOST_CHECK(!ctx.device().is_cuda());
  }
  // A buffer on the chosen device holds what each rank puts there.
  size_t n = 4096 + ctx.rank();
  Buffer<float> b(ctx.device(), n);
  b.fill_bytes(0xFF);
  fill(ctx.device(), b.data(), n, float(ctx.rank()) + 0.5f, ctx.device().stream);
  std::vector<float> got = b.download();
  size_t bad = testing::count_mismatches(got, std::vector<float>(n, float(ctx.rank()) + 0.5f), 0, 0, "fill");
  BOOST_CHECK(testing::all_ranks(bad == 0));
}
