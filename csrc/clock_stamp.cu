// The device's clock (%globaltimer, ns) written once into pinned, mapped host memory: the host,
// spinning on it, learns the offset between its own clock and the device's
// (dlmrt/engine/block/stream_lag.py: `calibrate`).
extern "C" __global__ void dlmrt_clock_stamp(long long* out) {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *(volatile long long*)out = (long long)now;
  __threadfence_system();
}
