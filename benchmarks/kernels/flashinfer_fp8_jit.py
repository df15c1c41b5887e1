"""FlashInfer's SM90 CUTLASS fused-MoE JIT module (`fused_moe_90`) trimmed to the FP8 W8A8 path
with bf16 output, so that its build fits the device's time limits (`moe_flashinfer.py`).

The stock module compiles every SM90 grouped / mixed-input / weight-only CUTLASS kernel the runner
can dispatch to (about 1,700 kernels in 220 generated files, each file about five minutes of nvcc,
plus 14 MoeGemmRunner translation units of several minutes each: over an hour on 16 cores). Here
the same sources are compiled, except that
- FlashInfer's generated kernel files are split in two: the e4m3 x e4m3 -> bf16 TMA
  warp-specialized grouped GEMMs (all 72: every tile, cluster, swap-AB and epilogue-fusion variant,
  the tactics the FP8 runner can pick from) are compiled as they are, `per_file` per translation
  unit; every other launcher comes from a stub that defines the same template instantiation (the
  same symbol, so the module links and loads) with a body that throws;
- of the MoeGemmRunner instantiations (moe_gemm_kernels_*.cu) only MoeGemmRunner<e4m3, e4m3, bf16>
  (the one CutlassMoeFCRunner<e4m3, e4m3, bf16> holds) is compiled; the others are stubs too.
The FP8 path never reaches a stub; any other dtype path throws "this kernel was not built".

The C++ text of those stubs (`STUB_INL` per launcher kind, `_RUNNER_STUB` for MoeGemmRunner) is in
`flashinfer_stubs.py`.

`spec()` returns the trimmed JitSpec; `install(spec)` makes FlashInfer's
`get_cutlass_fused_moe_module("90")` build and use it. A build's .so copied to
flashinfer/data/aot/NAME/NAME.so is loaded from there by FlashInfer, without nvcc.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from benchmarks.kernels.flashinfer_stubs import _NS_CLOSE, _NS_OPEN, _RUNNER_STUB, STUB_INL, TMA_WS

NAME = "fused_moe_90_dlmrt_fp8"
# The MoeGemmRunner the FP8 W8A8 runner with bf16 output uses (CutlassMoeFCRunner<fp8, fp8, bf16>
# holds MoeGemmRunner<T, WeightType, OutputType, BackBoneType = OutputType>).
KEPT_RUNNER = "MoeGemmRunner<__nv_fp8_e4m3, __nv_fp8_e4m3, __nv_bfloat16>;"
_RUNNER = re.compile(r"template class MoeGemmRunner<[^;]*;", re.S)


# The fixed (non-generated) sources, longest first so that ninja starts them first.
_FIRST = (
    "cutlass_fused_moe_instantiation.cu",
    "flashinfer_cutlass_fused_moe_binding.cu",
    "moe_gemm_kernels_",
    "fp8_blockscale_gemm.cu",
)

_BLOCK = re.compile(
    r"(#if[^\n]*\n)?\s*INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\((.*?)\);\s*(#endif)?", re.S
)


def is_kept(args: list[str]) -> bool:
    """A TMA WS instantiation the FP8 W8A8 runner with bf16 output can pick: Sm90, e4m3 x e4m3 ->
    bf16 (args: arch, dtype, weight dtype, output dtype, ...)."""
    return args[:4] == ["Sm90", "__nv_fp8_e4m3", "__nv_fp8_e4m3", "__nv_bfloat16"]


def _write(path: Path, text: str) -> Path:
    """Write only when the text changed (ninja rebuilds on a newer file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _fixed_order(path: Path) -> int:
    return next((i for i, k in enumerate(_FIRST) if path.name.startswith(k)), len(_FIRST))


def _is_kept(match: re.Match) -> bool:
    return " ".join(match[0].split()) == f"template class {KEPT_RUNNER}"


def _split_runners(fixed: list[Path], out: Path) -> tuple[list[Path], list[str]]:
    """FlashInfer's moe_gemm_kernels_*.cu each instantiate MoeGemmRunner for some dtypes (minutes
    of nvcc each): the kept one is compiled from a copy that instantiates only it, every other
    instantiation goes to the stub (returned: the files' texts after their #include)."""
    keep, bodies = [], []
    for src in fixed:
        if not src.name.startswith("moe_gemm_kernels_"):
            keep.append(src)
            continue
        body = src.read_text().split('#include "moe_gemm_template_dispatch.h"', 1)[1]
        if not any(_is_kept(m) for m in _RUNNER.finditer(body)):
            bodies.append(body)
            continue
        only = _RUNNER.sub(lambda m: m[0] if _is_kept(m) else "", body)
        header = src.parent / "moe_gemm_template_dispatch.h"
        keep.append(_write(out / src.name, f'#include "{header}"{only}'))
        bodies.append(_RUNNER.sub(lambda m: "" if _is_kept(m) else m[0], body))
    return keep, bodies


def _partition(generated: list[Path]) -> tuple[list[str], dict, dict, dict[str, str]]:
    """FlashInfer's generated kernel files, sorted out: the kept FP8 instantiations (TMA WS
    blocks), each launcher kind's stubbed ones, the counts, and each kind's #include line."""
    kept: list[str] = []
    stubs: dict[str, list[str]] = {kind: [] for kind in STUB_INL}
    counts = {"stock_generated_files": len(generated), "kept": 0, "stubbed": 0}
    inl_path: dict[str, str] = {}
    for path in sorted(generated):
        text = path.read_text()
        include, body = text.split("\n", 1)
        kind = next((k for k in STUB_INL if include.rstrip().endswith(k + '"')), None)
        if kind is None:
            raise RuntimeError(f"unexpected launcher in {path.name}: {include}")
        inl_path[kind] = include
        if kind != TMA_WS:  # explicit instantiations, already namespaced: keep the text
            stubs[kind].append(body)
            counts["stubbed"] += body.count("template void")
            continue
        for guard, args, endif in _BLOCK.findall(body):
            block = f"{guard}INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM({args});\n{endif}\n"
            if is_kept([a.strip() for a in args.split(",")]):
                kept.append(block)
            else:
                stubs[TMA_WS].append(block)
                counts["stubbed"] += 1
    counts["kept"] = len(kept)
    if not kept:
        raise RuntimeError("no FP8 x FP8 -> bf16 SM90 instantiations found in FlashInfer's files")
    return kept, stubs, counts, inl_path


def spec(per_file: int = 6, stub_parts: int = 2, name: str = NAME):
    """The trimmed JitSpec: FlashInfer's stock fused_moe_90 spec (flags, includes, fixed sources)
    with its generated kernel files replaced by the kept FP8 kernels (`per_file` per translation
    unit) and the stubs (at most `stub_parts` translation units per launcher kind: generated
    files are the unit, so a kind of few files gets fewer). Returns (spec, counts)."""
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module

    stock = gen_cutlass_fused_moe_sm90_module()  # also writes FlashInfer's generated files
    generated = [s for s in stock.sources if s.name.endswith(".generated.cu")]
    out = jit_env.FLASHINFER_GEN_SRC_DIR / f"{name}_src"
    fixed, runner_stubs = _split_runners([s for s in stock.sources if s not in generated], out)
    fixed.sort(key=_fixed_order)
    kept, stubs, counts, inl_path = _partition(generated)
    sources = list(fixed)
    for i in range(0, len(kept), per_file):  # the kept kernels, as FlashInfer instantiates them
        chunk = "".join(kept[i : i + per_file])
        sources.append(
            _write(
                out / f"fp8_kernels_{i // per_file:03d}.cu",
                f"{inl_path[TMA_WS]}\n{_NS_OPEN}{chunk}{_NS_CLOSE}",
            )
        )
    inl = _write(out / "stub_moe_gemm_runner.h", _RUNNER_STUB)
    sources.append(
        _write(out / "stub_moe_gemm_runner.cu", f'#include "{inl}"\n' + "".join(runner_stubs))
    )
    counts["runners_stubbed"] = sum(len(_RUNNER.findall(b)) for b in runner_stubs)
    for kind, parts in stubs.items():
        if not parts:
            continue
        inl = _write(out / f"stub_{kind}", STUB_INL[kind])
        per = -(-len(parts) // stub_parts)  # ceil: at most stub_parts translation units
        for j in range(0, len(parts), per):
            body = "".join(parts[j : j + per])
            if kind == TMA_WS:
                body = f"{_NS_OPEN}{body}{_NS_CLOSE}"
            stem = f"stub_{kind.removesuffix('.inl')}_{j // per}"
            sources.append(_write(out / f"{stem}.cu", f'#include "{inl}"\n{body}'))
    written = {str(p) for p in sources} | {str(out / f"stub_{k}") for k in STUB_INL}
    for stale in out.iterdir():  # from an earlier partition (per_file, stub_parts)
        if str(stale) not in written and stale.name != "stub_moe_gemm_runner.h":
            stale.unlink()
    return dataclasses.replace(stock, name=name, sources=sources), counts


def install(jit_spec) -> None:
    """Make FlashInfer's `get_cutlass_fused_moe_module("90")` build and load `jit_spec`."""
    import flashinfer.fused_moe.core as core

    core.get_cutlass_fused_moe_module.cache_clear()
    core.gen_cutlass_fused_moe_sm90_module = lambda use_fast_build=False: jit_spec
