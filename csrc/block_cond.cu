// Condition kernel of the block graph's conditional WHILE node (compiled at start-up with NVRTC).
// Runs as the last node of every round: keep looping while the block is not done and the round cap
// is not reached. No headers needed: the builtin is declared here and resolved by the driver.
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);

extern "C" __global__ void dlmrt_block_cond(cudaGraphConditionalHandle handle, const bool* done,
                                            const long long* step, long long max_rounds) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    cudaGraphSetConditional(handle, (!*done && *step < max_rounds) ? 1u : 0u);
  }
}
