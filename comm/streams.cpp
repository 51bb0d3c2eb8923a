// streams.cpp: the stream contract of communicator.h. Each operation starts after the work its caller queued
// on its stream and that stream continues after the operation, through events, never host syncs. Scratch
// and staging memory are reused and freed only once the work that used them is known to be done (an
// explicit wait for the event that closes that work, never cudaFree's implicit device synchronization).
#include "comm/comm_impl.h"

#include <cstring>

namespace sparta {

void Communicator::Impl::begin_op(const char* name, Stream stream, size_t send_bytes, size_t recv_bytes,
                                  int root) {
  op_name = name;
  op_framed = true;
  op_send = send_bytes, op_recv = recv_bytes, op_root = root;
  pending.clear();
  events_used = 0;
  copy_ordered = false;
  touch();
#if SPARTA_CUDA
  if (cuda) {
    // The communication stream starts after what the caller queued on its stream (inputs ready, outputs no
    // longer read), without a host sync. The copy stream follows only if the operation copies (see
    // order_copy_stream): the NCCL path then costs one event and one wait less.
    CUDA_CHECK(cudaEventRecord(input_ev, stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream, input_ev, 0));
  }
#else
  (void)stream;
#endif
}

void Communicator::Impl::end_op(Stream stream) {
  // cpu: the node group's MPI requests; cuda: pending work is on the communication stream, covered by done_ev.
  if (!cuda) {
    for (Ready& r : pending)
      if (!ready_done(r)) wait_ready(r, "the MPI calls of " + op_name + " in " + members(node_group));
  }
  pending.clear();
#if SPARTA_CUDA
  if (cuda) {
    // Copy-stream work of the operation was waited for before its MPI calls started (run_steps), so the
    // communication stream's end is the operation's end: the caller's stream continues after it.
    CUDA_CHECK(cudaEventRecord(done_ev, comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, done_ev, 0));
  }
#else
  (void)stream;
#endif
}

void Communicator::Impl::order_copy_stream() {
#if SPARTA_CUDA
  if (cuda && !copy_ordered) {
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream, input_ev, 0));
    copy_ordered = true;
  }
#endif
}

#if SPARTA_CUDA
CudaEvent Communicator::Impl::record(Stream s) {
  if (events_used == event_pool.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_pool.push_back(e);
  }
  CudaEvent e = event_pool[events_used++];
  CUDA_CHECK(cudaEventRecord(e, s));
  return e;
}
#endif

void Communicator::Impl::copy(void* dst, const void* src, size_t bytes, Stream s) {
  if (bytes == 0 || dst == src) return;
  if (!cuda) {
    std::memmove(dst, src, bytes);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
#else
  (void)s;
#endif
}

void Communicator::Impl::copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                 size_t height, Stream s) {
  if (width == 0 || height == 0) return;
  if (!cuda) {
    for (size_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, s));
#else
  (void)s;
#endif
}

char* Communicator::Impl::scratch_bytes(size_t bytes) {
  if (scratch.size() < bytes) {
    // The old scratch was last used by earlier operations: by their work on the communication stream, which
    // done_ev closes, and by device-to-host copies that run_steps waited for. The host waits for done_ev
    // (fault-aware) before freeing it, rather than counting on cudaFree to synchronize the device. With a
    // stream-ordered allocator the old buffer could instead be freed on the communication stream
    // (cudaFreeAsync) and this wait dropped. No work of the current operation is queued yet (callers ask
    // for scratch first), so done_ev does not wait for the caller's stream.
#if SPARTA_CUDA
    if (cuda && !scratch.empty()) wait_event(done_ev, "earlier operations still using the scratch buffer");
#endif
    scratch = Buffer<char>();
    scratch = Buffer<char>(dev, (bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20));
  }
  return scratch.data();
}

char* Communicator::Impl::staging_bytes(size_t bytes) {
  // The previous staged transfer's host-to-device copies (queued on the communication stream, closed by
  // stage_free_ev) may still read the buffer; its device-to-host copies were waited for before its MPI calls
  // started. So once stage_free_ev is done the buffer may be written by MPI again, or freed: an explicit
  // wait, not cudaFreeHost's implicit synchronization (pinned host memory has no stream-ordered free).
#if SPARTA_CUDA
  if (stage_busy) wait_event(stage_free_ev, "the host-to-device copies of the previous staged transfer");
#endif
  stage_busy = false;
  if (stage.bytes() < bytes) {
    stage = PinnedBuffer<char>();
    stage = PinnedBuffer<char>(dev.backend, bytes);
  }
  return stage.data();
}

}  // namespace sparta
