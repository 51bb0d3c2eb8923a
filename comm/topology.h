// topology.h: where this rank sits: its host, its node (a host, or a slice of one when ranks_per_node
// emulates several nodes on one machine), and the communicators that follow from that.
//
// Two notions of "local": the host (ranks sharing memory, found by MPI_Comm_split_type) decides which GPU a
// rank drives; the node decides which path data takes (NCCL inside a node, MPI between nodes). They are the
// same unless ranks_per_node cuts a host into emulated nodes, which lets the inter-node path run and be
// tested on one machine.
#pragma once

#include <mpi.h>

#include <string>

namespace sparta {

struct Topology {
  MPI_Comm world = MPI_COMM_NULL;  // duplicate of the communicator given
  int rank = 0, size = 1;
  std::string hostname;

  MPI_Comm host_comm = MPI_COMM_NULL;  // ranks on this host (shared memory)
  int host_rank = 0, host_size = 1;

  MPI_Comm node_comm = MPI_COMM_NULL;  // ranks of this (possibly emulated) node
  int local_rank = 0, local_size = 1;  // rank within the node, ranks in the node
  int node = 0, num_nodes = 1;         // node index (ordered by lowest world rank), number of nodes
  bool uniform = true;                 // every node has local_size ranks

  MPI_Comm cross_comm = MPI_COMM_NULL;  // ranks with the same local_rank, one per node, ordered by node
};

// Builds the topology from comm (collective over comm). ranks_per_node 0 means one node per host; k > 0
// cuts each host's ranks, in host-rank order, into nodes of k (the last one may be smaller).
// Throws sparta::Error for a negative ranks_per_node.
Topology make_topology(MPI_Comm comm, int ranks_per_node);
void free_topology(Topology& topo);

}  // namespace sparta
