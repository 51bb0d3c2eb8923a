// wait_abort.cpp: the fault-aware waits and the abort. Every wait (CUDA events, NCCL's ncclInProgress, MPI
// requests) polls ncclCommGetAsyncError and gives up after timeout_s without progress; giving up aborts the
// NCCL communicators (so that kernels waiting for a dead peer end) and the job, naming the operation, the
// mode, this rank, its peers and the bytes.
#include "comm/comm_impl.h"

#include <thread>

namespace sparta {

// "the cross group (world ranks 1,3)": names the ranks a collective waits for.
std::string members(const Group& g) {
  std::string list;
  for (size_t i = 0; i < g.world_of.size() && i < 16; ++i) list += (i ? "," : "") + std::to_string(g.world_of[i]);
  if (g.world_of.size() > 16) list += ",...";
  return strprintf("the %s group (world ranks %s)", g.name, list.c_str());
}

void Communicator::Impl::poll_health(const std::string& waiting_for) {
#if SPARTA_CUDA
  for (NcclComm c : nccl_comms) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c, &state);
    if (r != ncclSuccess) fail(strprintf("ncclCommGetAsyncError returned %s", ncclGetErrorString(r)));
    if (state != ncclSuccess && state != ncclInProgress)
      fail(strprintf("NCCL reported %s (%s) while waiting for %s", ncclGetErrorString(state), ncclGetLastError(c),
                     waiting_for.c_str()));
  }
#endif
  double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_progress).count();
  if (idle > opt.timeout_s)
    fail(strprintf("no progress for %.1f s (timeout %g s) while waiting for %s", idle, opt.timeout_s,
                   waiting_for.c_str()));
  // A peer that timed out in a host wait asks where this rank is (only long waits: the fast path stays bare).
  if (idle > 0.05) answer_roll_calls(op_name);
  std::this_thread::yield();
}

void Communicator::Impl::fail(const std::string& why) {
  std::string detail = op_detail;
  if (op_framed)
    detail = strprintf("this rank sends %zu bytes and receives %zu bytes; peers: all %d ranks", op_send, op_recv,
                       size) +
             (op_root >= 0 ? strprintf(", root %d", op_root) : std::string());
  std::string msg = strprintf(
      "communication failed in %s (mode %s, %s backend) on rank %d of %d (node %d of %d, local rank %d of %d): "
      "%s. %s",
      op_name.c_str(), comm_mode_name(opt.mode), cuda ? "cuda" : "cpu", rank, size, node, num_nodes, local,
      local_size, why.c_str(), detail.c_str());
#if SPARTA_CUDA
  // Aborting stops NCCL kernels that wait for a peer that will never come, so the process can end.
  for (NcclComm c : nccl_comms) ncclCommAbort(c);
  nccl_comms.clear();
#endif
  SPARTA_FATAL("%s", msg.c_str());
}

void Communicator::Impl::fail_args(const char* op, const std::string& why) {
  op_name = op;
  op_framed = false;
  op_detail = strprintf("peers: all %d ranks", size);
  fail(why);
}

void Communicator::Impl::check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  fail(strprintf("MPI error %d (%.*s) in %s", code, len, text, what.c_str()));
}

bool Communicator::Impl::ready_done(Ready& r) {
#if SPARTA_CUDA
  if (r.event && !event_done(r.event)) return false;
#endif
  for (auto& reqs : r.reqs) {
    if (reqs->empty()) continue;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs->size()), reqs->data(), &flag, MPI_STATUSES_IGNORE),
              "MPI requests of the node group's part of " + op_name);
    if (!flag) return false;
  }
  return true;
}

void Communicator::Impl::wait_ready(Ready& r, const std::string& what) {
  while (!ready_done(r)) poll_health(what);
  touch();
}

void Communicator::Impl::wait_requests(std::vector<MPI_Request>& reqs, const std::string& what) {
  for (;;) {
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what);
    if (flag) break;
    poll_health(what);
  }
  touch();
}

#if SPARTA_CUDA
bool Communicator::Impl::event_done(CudaEvent ev) {
  cudaError_t q = cudaEventQuery(ev);
  if (q == cudaSuccess) return true;
  if (q == cudaErrorNotReady) return false;
  cudaGetLastError();
  fail(strprintf("CUDA error %s (%s) on the communication stream", cudaGetErrorName(q), cudaGetErrorString(q)));
}

void Communicator::Impl::wait_event(CudaEvent ev, const std::string& what) {
  while (!event_done(ev)) poll_health(what);
  touch();
}

void Communicator::Impl::nccl_wait_in_progress(ncclResult_t r, NcclComm comm, const std::string& what) {
  if (r != ncclInProgress)
    fail(strprintf("%s returned %s (%s)", what.c_str(), ncclGetErrorString(r), comm ? ncclGetLastError(comm) : ""));
  // Non-blocking communicator: the call goes on in the background; nothing may be queued until it is done.
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress)
      fail(strprintf("%s failed: %s (%s)", what.c_str(), ncclGetErrorString(state), ncclGetLastError(comm)));
    poll_health(what);
  }
  touch();
}
#endif

}  // namespace sparta
