// check_calls.cpp: the optional check that every rank makes the same call (communicator.h, "Call checks").
#include "comm/comm_impl.h"

#include <cstring>

namespace sparta {

namespace {

// What one rank is about to call, compared byte for byte with every other rank's.
struct CallSig {
  char op[24];
  int32_t type;  // DataType, or -1 where the call moves no typed buffer
  int32_t root;
  uint64_t count;
  uint64_t counts_hash;  // all_gather_v's counts (FNV-1a), else 0
};

uint64_t hash_counts(const std::vector<size_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (size_t x : v) {
    h ^= uint64_t(x);
    h *= 1099511628211ull;
  }
  return h;
}

std::string call_text(const CallSig& s) {
  std::string d = s.op;
  const char* type = s.type >= 0 ? dtype_name(DataType(s.type)) : nullptr;
  if (type && s.counts_hash) d += strprintf(" of %s (counts hash %016llx)", type, (unsigned long long)s.counts_hash);
  else if (type && s.count) d += strprintf(" of %llu %s", (unsigned long long)s.count, type);
  else if (type) d += strprintf(" of %s", type);
  if (s.root >= 0) d += strprintf(" from root %d", s.root);
  return d;
}

}  // namespace

void Communicator::Impl::check_call(const char* op, int type, size_t count, const std::vector<size_t>* counts,
                                    int root) {
  fault_point(op);  // the fault tests' hook (deadline.h); nothing outside them
  if (!check) return;
  ++calls;
  CallSig mine;
  std::memset(&mine, 0, sizeof(mine));
  std::strncpy(mine.op, op, sizeof(mine.op) - 1);
  mine.type = type;
  mine.count = count;
  mine.counts_hash = counts ? hash_counts(*counts) : 0;
  mine.root = root;
  std::vector<CallSig> all(size);
  std::vector<MPI_Request> req(1);
  const std::string saved = op_name;
  op_name = strprintf("the check of call %llu (%s)", (unsigned long long)calls, op);
  touch();
  check_mpi(MPI_Iallgather(&mine, sizeof(mine), MPI_BYTE, all.data(), sizeof(mine), MPI_BYTE, world.mpi, req.data()),
            "MPI_Iallgather of the calls");
  wait_requests(req, "every rank's call (SPARTA_COMM_CHECK)");
  for (int r = 0; r < size; ++r) {
    if (std::memcmp(&all[r], &mine, sizeof(mine)) == 0) continue;
    fail_args(op, strprintf("call %llu differs between ranks: rank %d calls %s, rank %d calls %s",
                            (unsigned long long)calls, rank, call_text(mine).c_str(), r, call_text(all[r]).c_str()));
  }
  op_name = saved;
}

void Communicator::Impl::check_counts(const std::vector<size_t>& send_counts, const std::vector<size_t>& recv_counts) {
  if (!check) return;
  std::vector<uint64_t> out(send_counts.begin(), send_counts.end()), in(size);
  std::vector<MPI_Request> req(1);
  check_mpi(MPI_Ialltoall(out.data(), 1, MPI_UINT64_T, in.data(), 1, MPI_UINT64_T, world.mpi, req.data()),
            "MPI_Ialltoall of the checked counts");
  wait_requests(req, "every rank's send counts (SPARTA_COMM_CHECK)");
  for (int p = 0; p < size; ++p) {
    if (in[p] == recv_counts[p]) continue;
    fail_args("all_to_all_v", strprintf("call %llu: rank %d sends %llu elements to rank %d, which expects %zu",
                                        (unsigned long long)calls, p, (unsigned long long)in[p], rank,
                                        recv_counts[p]));
  }
}

}  // namespace sparta
