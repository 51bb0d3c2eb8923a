#include "src/base/agree.h"

#include <climits>

namespace sparta {

std::string bcast_string(MPI_Comm comm, int root, const std::string& s) {
  long long n = static_cast<long long>(s.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm));
  std::string out = s;
  out.resize(static_cast<size_t>(n));
  if (n > 0) MPI_CHECK(MPI_Bcast(&out[0], static_cast<int>(n), MPI_CHAR, root, comm));
  return out;
}

void agree_on_error(MPI_Comm comm, const std::string& error) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int mine = error.empty() ? INT_MAX : rank, first = INT_MAX;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;  // the common case: one small reduction
  int failed_here = error.empty() ? 0 : 1, failed = 0;
  MPI_CHECK(MPI_Allreduce(&failed_here, &failed, 1, MPI_INT, MPI_SUM, comm));
  std::string msg = bcast_string(comm, first, error);
  std::string more = failed > 1 ? strprintf(" (and %d other rank(s) failed)", failed - 1) : "";
  // Raised on every rank of comm: when that is the whole world, a program may end without MPI_Abort.
  int same = MPI_UNEQUAL;
  MPI_CHECK(MPI_Comm_compare(comm, MPI_COMM_WORLD, &same));
  throw Error(strprintf("rank %d: %s%s", first, msg.c_str(), more.c_str()), same == MPI_IDENT || same == MPI_CONGRUENT);
}

}  // namespace sparta
