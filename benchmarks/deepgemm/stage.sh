#!/usr/bin/env bash
# Export from the fetched git mirrors exactly what DeepGEMM needs to build its extension and to
# JIT-compile its kernels into .deepgemm/ (ignored by git; carried to the GPU machine with the
# tree: `run(..., carry=[".deepgemm"])`). Runs where the mirrors are (no network needed):
#
#   bash benchmarks/deepgemm/stage.sh
#
# Layout of .deepgemm/ (benchmarks/deepgemm/README.md says why each piece is there):
#   DeepGEMM/setup.py, scripts/generate_pyi.py   the build (setup.py imports the script)
#   DeepGEMM/csrc/                               the extension's C++ sources (python_api.cpp)
#   DeepGEMM/deep_gemm/                          the Python package and include/deep_gemm/ (JIT)
#   DeepGEMM/third-party/cutlass/include/{cute,cutlass}   at DeepGEMM's submodule commit
#   DeepGEMM/third-party/fmt/include/            at DeepGEMM's submodule commit (header-only)
#   STAMP                                        the three commits (build.sh rebuilds on change)
# Left out: DeepGEMM's tests, CI, docs, third-party/tilelang_ops (its tests' baseline), and all of
# CUTLASS but include/cute and include/cutlass (DeepGEMM's setup.py copies only those two).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MIRRORS=${DG_MIRRORS:-/work/.mirror}
DG_GIT=${DG_GIT:-$MIRRORS/deepseek-ai+DeepGEMM/repo}
CUTLASS_GIT=${CUTLASS_GIT:-$MIRRORS/NVIDIA+cutlass/repo}
FMT_GIT=${FMT_GIT:-$MIRRORS/fmtlib+fmt/repo}
DG_REV=${DG_REV:-HEAD}
OUT=$ROOT/.deepgemm

for d in "$DG_GIT" "$CUTLASS_GIT" "$FMT_GIT"; do
  git --git-dir="$d" rev-parse --verify -q HEAD >/dev/null \
    || { echo "stage.sh: no git mirror at $d (fetch it first: github:<owner>/<name>)" >&2; exit 1; }
done

dg_commit=$(git --git-dir="$DG_GIT" rev-parse "$DG_REV^{commit}")
# The submodules' commits as DeepGEMM pins them (gitlink entries of its tree).
submodule_commit() {
  git --git-dir="$DG_GIT" ls-tree "$dg_commit" "$1" | awk '$2 == "commit" {print $3}'
}
cutlass_commit=$(submodule_commit third-party/cutlass)
fmt_commit=$(submodule_commit third-party/fmt)
[ -n "$cutlass_commit" ] && [ -n "$fmt_commit" ] \
  || { echo "stage.sh: DeepGEMM $dg_commit pins no cutlass / fmt submodule" >&2; exit 1; }
for pair in "$CUTLASS_GIT:$cutlass_commit" "$FMT_GIT:$fmt_commit"; do
  git --git-dir="${pair%%:*}" cat-file -e "${pair##*:}^{commit}" 2>/dev/null \
    || { echo "stage.sh: ${pair%%:*} lacks commit ${pair##*:} (fetch a newer snapshot)" >&2; exit 1; }
done

rm -rf "$OUT"
mkdir -p "$OUT/DeepGEMM/third-party/cutlass" "$OUT/DeepGEMM/third-party/fmt"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# export GIT_DIR COMMIT DEST PATH...: `git archive` of PATHs into DEST, then a check that every
# file the commit holds under them arrived (a snapshot mirror may lack its largest blobs; git
# archive names such a blob even outside PATHs, so its messages are shown only on a shortfall).
export_paths() {
  local git_dir=$1 commit=$2 dest=$3
  shift 3
  git --git-dir="$git_dir" archive "$commit" "$@" 2>>"$log" | tar -x -C "$dest"
  local want got
  want=$(git --git-dir="$git_dir" ls-tree -r --name-only "$commit" "$@" | wc -l)
  got=$(cd "$dest" && find "$@" -type f | wc -l)
  if [ "$want" != "$got" ]; then
    cat "$log" >&2
    echo "stage.sh: $git_dir $commit: $got of $want files under $* exported" >&2
    exit 1
  fi
}
export_paths "$DG_GIT" "$dg_commit" "$OUT/DeepGEMM" \
  setup.py LICENSE scripts/generate_pyi.py csrc deep_gemm
export_paths "$CUTLASS_GIT" "$cutlass_commit" "$OUT/DeepGEMM/third-party/cutlass" \
  LICENSE.txt include/cute include/cutlass
export_paths "$FMT_GIT" "$fmt_commit" "$OUT/DeepGEMM/third-party/fmt" LICENSE include

cat >"$OUT/STAMP" <<STAMP
deepgemm $dg_commit
cutlass $cutlass_commit
fmt $fmt_commit
STAMP

bytes=$(du -sb "$OUT" | cut -f1)
echo "staged $OUT: $((bytes / 1024 / 1024)) MiB ($bytes bytes), $(find "$OUT" -type f | wc -l) files"
cat "$OUT/STAMP"
if [ "$bytes" -ge $((60 * 1024 * 1024)) ]; then
  echo "stage.sh: .deepgemm is over 60 MiB; the device carry allows 64 MiB for everything" >&2
  exit 1
fi
