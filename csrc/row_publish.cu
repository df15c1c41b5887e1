// The round stream (dlmrt/engine/block/row_stream.py): after a round, the block's rows go into one
// slot of a ring in pinned, mapped host memory, which the host reads while the graph still runs.
// Slot layout (int64): [round | block_start | row 0 .. row B-1], a row = its token once resolved,
// -1 while masked. The round number is written last and zeroed first, each after a system-wide
// fence, so a reader that sees the same round before and after copying the rows has a whole slot.
extern "C" __global__ void dlmrt_row_publish(const long long* canvas, const unsigned char* unresolved,
                                             const long long* step, const long long* block_start,
                                             long long* ring, int rows, int slots) {
  const long long round = *step;
  volatile long long* slot = ring + (round % slots) * (long long)(rows + 2);
  if (threadIdx.x == 0) slot[0] = 0;  // being rewritten
  __threadfence_system();
  __syncthreads();
  for (int i = threadIdx.x; i < rows; i += blockDim.x) slot[2 + i] = unresolved[i] ? -1 : canvas[i];
  if (threadIdx.x == 0) slot[1] = *block_start;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) slot[0] = round;
}
