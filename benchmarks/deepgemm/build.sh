#!/usr/bin/env bash
# Build DeepGEMM's extension from the staged sources (.deepgemm/, stage.sh) and install the
# package into $DEEPGEMM_PREFIX/site (default .deepgemm-build/site, ignored by git). Runs ON THE
# GPU MACHINE, offline; idempotent: skips the build when site/ already holds the staged commits.
#
#   bash benchmarks/deepgemm/build.sh          # then: . benchmarks/deepgemm/env.sh
#
# Steps (benchmarks/deepgemm/README.md says why):
# 1. env.sh: CUDA_HOME, PYTHONPATH, DG_JIT_CACHE_DIR.
# 2. check the toolchain: nvcc >= 12.3 under CUDA_HOME (the JIT runs it), torch
#    built with CUDA, and what DeepGEMM's setup.py imports (setuptools, packaging, wheel).
# 3. copy .deepgemm/DeepGEMM to $DEEPGEMM_PREFIX/DeepGEMM and run DeepGEMM's own setup.py there:
#    `python setup.py build_ext --inplace` (its develop.sh builds the same extension; no
#    download, no isolation, no dependency resolution). DG_USE_LOCAL_VERSION=0: the version is
#    the package's own, without asking git (the copy is no git checkout).
# 4. assemble site/deep_gemm: the package + the built _C*.so + include/cute and include/cutlass
#    (what setup.py's build_py would copy into a wheel), so the JIT finds every header under
#    deep_gemm/include.
# 5. import check: `import deep_gemm` and print its version, the JIT's CUDA_HOME and the GPU.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
# shellcheck source=benchmarks/deepgemm/env.sh
. "$ROOT/benchmarks/deepgemm/env.sh"
STAGED=$ROOT/.deepgemm
SRC=$DEEPGEMM_PREFIX/DeepGEMM
SITE=$DEEPGEMM_PREFIX/site

fail() { echo "build.sh: $*" >&2; exit 1; }

[ -f "$STAGED/STAMP" ] || fail "no $STAGED/STAMP: run stage.sh where the mirrors are, then carry .deepgemm"
[ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ] || fail "no nvcc: set CUDA_HOME (got '${CUDA_HOME:-}')"
# With CUDA >= 12.4 headers the JIT finds a cubin's kernel through cuLibraryEnumerateKernels
# (csrc/jit/handle.hpp); cuobjdump is run only for DG_JIT_DUMP_ASM / DG_JIT_DUMP_SASS.
[ -x "$CUDA_HOME/bin/cuobjdump" ] || echo "note: no $CUDA_HOME/bin/cuobjdump (only DG_JIT_DUMP_* need it)"
nvcc_version=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
echo "CUDA_HOME=$CUDA_HOME nvcc $nvcc_version"
"$PYTHON" - "$nvcc_version" <<'PY' || exit 1
import importlib, sys
import torch
major, minor = map(int, sys.argv[1].split("."))
if (major, minor) < (12, 3):  # csrc/jit/compiler.hpp: NVCCCompiler asserts >= 12.3
    sys.exit(f"build.sh: nvcc {major}.{minor} is older than DeepGEMM's minimum 12.3")
if torch.version.cuda is None:
    sys.exit(f"build.sh: torch {torch.__version__} has no CUDA")
missing = []
for name in ("setuptools", "packaging.version", "wheel.bdist_wheel"):  # setup.py's imports
    try:
        importlib.import_module(name)
    except ImportError:
        missing.append(name)
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); setup.py imports missing: {missing or 'none'}")
if "setuptools" in missing or "packaging.version" in missing:
    sys.exit(f"build.sh: {missing} not importable and there is no network here")
PY

if [ -f "$SITE/STAMP" ] && cmp -s "$STAGED/STAMP" "$SITE/STAMP" \
    && ls "$SITE"/deep_gemm/_C*.so >/dev/null 2>&1; then
  echo "DeepGEMM already built in $SITE for:"; cat "$SITE/STAMP"
else
  rm -rf "$SRC" "$SITE"
  mkdir -p "$DEEPGEMM_PREFIX"
  cp -a "$STAGED/DeepGEMM" "$SRC"
  shim=""
  if ! "$PYTHON" -c "import wheel.bdist_wheel" 2>/dev/null; then
    # setup.py imports wheel.bdist_wheel at the top and uses it only for bdist_wheel (not run
    # here); setuptools >= 70.1 carries the same command
    shim=$DEEPGEMM_PREFIX/shim
    mkdir -p "$shim/wheel"
    : >"$shim/wheel/__init__.py"
    echo "from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401" >"$shim/wheel/bdist_wheel.py"
  fi
  echo "building DeepGEMM's extension in $SRC"
  t0=$(date +%s)
  (cd "$SRC" && PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" DG_USE_LOCAL_VERSION=0 \
    "$PYTHON" setup.py build_ext --inplace)
  echo "extension built in $(( $(date +%s) - t0 )) s"
  ls "$SRC"/deep_gemm/_C*.so >/dev/null 2>&1 || fail "setup.py left no deep_gemm/_C*.so in $SRC"
  mkdir -p "$SITE"
  cp -a "$SRC/deep_gemm" "$SITE/deep_gemm"
  cp -a "$SRC/third-party/cutlass/include/cute" "$SRC/third-party/cutlass/include/cutlass" \
    "$SITE/deep_gemm/include/"
  cp "$STAGED/STAMP" "$SITE/STAMP"
fi

mkdir -p "$DG_JIT_CACHE_DIR"
cd "$ROOT"
"$PYTHON" -c "import deep_gemm, torch; print('deep_gemm', deep_gemm.__version__, 'from', deep_gemm.__file__, '| CUDA_HOME', '$CUDA_HOME', '| GPU', torch.cuda.get_device_name() if torch.cuda.is_available() else None, '| JIT cache', '$DG_JIT_CACHE_DIR')"
