// The round stream (dlmrt/engine/block/row_stream.py): after a round, one int64 row built by torch
// ops on the device (`payload`, payload[0] = the round number, >= 1) is copied into slot
// `round % slots` of a ring in pinned, mapped host memory, which the host reads while the graph
// still runs. The slot's round number is zeroed first and written last, each after a system-wide
// fence, so a reader that sees the same round before and after copying a slot has a whole one.
// A slot holds `width` payload values, then the device's clock (%globaltimer, ns) at the publish:
// what the stream's lag is measured from (dlmrt/engine/block/stream_lag.py).
extern "C" __global__ void dlmrt_slot_publish(const long long* payload, long long* ring, int width,
                                              int slots) {
  const long long round = payload[0];
  volatile long long* slot = ring + (round % slots) * (long long)(width + 1);
  if (threadIdx.x == 0) slot[0] = 0;  // being rewritten
  __threadfence_system();
  __syncthreads();
  for (int i = 1 + threadIdx.x; i < width; i += blockDim.x) slot[i] = payload[i];
  if (threadIdx.x == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    slot[width] = (long long)now;
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) slot[0] = round;
}
