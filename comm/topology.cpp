// topology.cpp: see topology.h.
#include "comm/topology.h"

#include <unistd.h>

#include <vector>

#include "src/base/check.h"

namespace sparta {

Topology make_topology(MPI_Comm comm, int ranks_per_node) {
  SPARTA_REQUIRE(ranks_per_node >= 0, "ranks_per_node: expected 0 (one node per host) or a positive count, found %d",
                 ranks_per_node);
  Topology t;
  MPI_CHECK(MPI_Comm_dup(comm, &t.world));
  MPI_CHECK(MPI_Comm_rank(t.world, &t.rank));
  MPI_CHECK(MPI_Comm_size(t.world, &t.size));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  t.hostname = host;

  MPI_CHECK(MPI_Comm_split_type(t.world, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &t.host_comm));
  MPI_CHECK(MPI_Comm_rank(t.host_comm, &t.host_rank));
  MPI_CHECK(MPI_Comm_size(t.host_comm, &t.host_size));

  int slice = ranks_per_node > 0 ? t.host_rank / ranks_per_node : 0;
  // A node is named by its lowest world rank: unique across hosts and slices, and ordered like the world.
  int slice_leader = t.rank;
  MPI_Comm slice_probe;
  MPI_CHECK(MPI_Comm_split(t.host_comm, slice, t.host_rank, &slice_probe));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &slice_leader, 1, MPI_INT, MPI_MIN, slice_probe));
  MPI_CHECK(MPI_Comm_free(&slice_probe));
  MPI_CHECK(MPI_Comm_split(t.world, slice_leader, t.rank, &t.node_comm));
  MPI_CHECK(MPI_Comm_rank(t.node_comm, &t.local_rank));
  MPI_CHECK(MPI_Comm_size(t.node_comm, &t.local_size));

  // Number the nodes: leaders (local_rank 0) in world-rank order.
  std::vector<int> leaders(t.size);
  int is_leader = t.local_rank == 0 ? 1 : 0;
  MPI_CHECK(MPI_Allgather(&is_leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, t.world));
  std::vector<int> node_of_leader(t.size, -1);
  t.num_nodes = 0;
  for (int r = 0; r < t.size; ++r)
    if (leaders[r]) node_of_leader[r] = t.num_nodes++;
  t.node = node_of_leader[slice_leader];

  int min_size = t.local_size, max_size = t.local_size;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &min_size, 1, MPI_INT, MPI_MIN, t.world));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &max_size, 1, MPI_INT, MPI_MAX, t.world));
  t.uniform = min_size == max_size;

  MPI_CHECK(MPI_Comm_split(t.world, t.local_rank, t.node, &t.cross_comm));
  return t;
}

void free_topology(Topology& t) {
  for (MPI_Comm* c : {&t.cross_comm, &t.node_comm, &t.host_comm, &t.world})
    if (*c != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(c));
}

}  // namespace sparta
