# Source (bash) on the GPU machine: the environment DeepGEMM is built and run with. build.sh
# sources it; a benchmark or test run sources it after build.sh:
#
#   . benchmarks/deepgemm/env.sh && python -m benchmarks.deepgemm.shapes
#
# CUDA_HOME     the toolkit: setup.py compiles against $CUDA_HOME/include (and include/cccl),
#               and deep_gemm/__init__.py hands it to the JIT, which runs $CUDA_HOME/bin/nvcc
#               (DG_JIT_NVCC_COMPILER overrides that path). Default:
#               /usr/local/cuda, else two levels above the resolved `nvcc` on PATH.
# PYTHONPATH    + $DEEPGEMM_PREFIX/site, which holds only the built `deep_gemm` package (with
#               include/deep_gemm, include/cute, include/cutlass: the JIT's -I directory is the
#               package's include/, there is no separate CUTLASS path variable).
# DG_JIT_CACHE_DIR  the compiled kernels ($DEEPGEMM_PREFIX/jit-cache; DeepGEMM's default is
#               ~/.deep_gemm), kept between calls while the machine stays warm.
_dg_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export DEEPGEMM_PREFIX=${DEEPGEMM_PREFIX:-$_dg_root/.deepgemm-build}
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    CUDA_HOME=/usr/local/cuda
  elif command -v nvcc >/dev/null; then
    # a wrapper script on PATH (`exec /usr/local/cuda-X/bin/nvcc "$@"`) is not a symlink to
    # resolve; nvcc's dry run names the bin/ directory it really runs from (_HERE_)
    _dg_bin=$(nvcc -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p')
    CUDA_HOME=$(dirname "${_dg_bin:-$(readlink -f "$(command -v nvcc)")}")
    [ -n "$_dg_bin" ] || CUDA_HOME=$(dirname "$CUDA_HOME")
    unset _dg_bin
  fi
fi
export CUDA_HOME
case ":${PYTHONPATH:-}:" in
  *":$DEEPGEMM_PREFIX/site:"*) ;;
  *) export PYTHONPATH="$DEEPGEMM_PREFIX/site${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-$DEEPGEMM_PREFIX/jit-cache}
unset _dg_root
