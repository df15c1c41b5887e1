"""Every DLMRT_* environment variable, read in one place."""

from __future__ import annotations

import os
from pathlib import Path


def log_level() -> str:
    """DLMRT_LOG_LEVEL: logging level of the `dlmrt` logger (default WARNING; the CLI's -v sets INFO)."""
    return os.environ.get("DLMRT_LOG_LEVEL", "WARNING").upper()


def ops_impl() -> str:
    """DLMRT_OPS: "auto" (default: Triton kernels on CUDA) or "torch" (force the plain-PyTorch twins)."""
    return os.environ.get("DLMRT_OPS", "auto").lower()


def hf_hub_cache() -> Path:
    """HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub: where cached hub ids are looked up."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub"


def tp_timeout_s() -> float:
    """DLMRT_TP_TIMEOUT_S: seconds a tensor-parallel collective outside a CUDA graph waits for a
    peer before the job ends with an error naming it (default 120)."""
    return float(os.environ.get("DLMRT_TP_TIMEOUT_S", "120"))


def fp8_gemms() -> str:
    """DLMRT_FP8_GEMMS: which dense linears of an FP8 model run as FP8 GEMMs on CUDA: "measured"
    (default: each shape timed at start-up against bf16, the faster kept), "all" or "none"."""
    value = os.environ.get("DLMRT_FP8_GEMMS", "measured").lower()
    if value not in ("measured", "all", "none"):
        raise ValueError(f"DLMRT_FP8_GEMMS={value!r}: expected 'measured', 'all' or 'none'")
    return value


def fp8_gemm_kernel() -> str:
    """DLMRT_FP8_GEMM_KERNEL: which FP8 GEMM the start-up measurement may pick for a dense linear
    (`ops/fp8_choice.py`): "measured" (default: the faster of cuBLAS and kernels/fp8_gemm.py),
    "cublas" or "triton"."""
    value = os.environ.get("DLMRT_FP8_GEMM_KERNEL", "measured").lower()
    if value not in ("measured", "cublas", "triton"):
        raise ValueError(
            f"DLMRT_FP8_GEMM_KERNEL={value!r}: expected 'measured', 'cublas' or 'triton'"
        )
    return value


def fp8_glu() -> str:
    """DLMRT_FP8_GLU: whether an FP8 gated MLP runs gate|up and its activation as one kernel
    (kernels/fp8_glu_gemm.py, `ops/fp8_glu_choice.py`): "measured" (default: where it times
    faster than the separate GEMM and activation), "on" or "off"."""
    value = os.environ.get("DLMRT_FP8_GLU", "measured").lower()
    if value not in ("measured", "on", "off"):
        raise ValueError(f"DLMRT_FP8_GLU={value!r}: expected 'measured', 'on' or 'off'")
    return value


def bf16_glu() -> str:
    """DLMRT_BF16_GLU: whether a dense gated MLP in the model dtype (bf16) runs gate|up and its
    activation as one kernel (kernels/fp8_glu_gemm.py's unscaled form, `ops/bf16_glu_choice.py`):
    "off" (default: on an H100 it lost to cuBLAS at every block shape, docs/kernels.md), "auto"
    (on CUDA, where it times faster than
    cuBLAS's GEMM and the activation kernel, per shape) or "on" (always; the CPU runs its twin)."""
    value = os.environ.get("DLMRT_BF16_GLU", "off").lower()
    if value not in ("off", "auto", "on"):
        raise ValueError(f"DLMRT_BF16_GLU={value!r}: expected 'off', 'auto' or 'on'")
    return value


def fp8_experts() -> str:
    """DLMRT_FP8_EXPERTS: how FP8 routed experts run on CUDA: "measured" (default: W8A8, the
    activations quantized too, unless weight-only W8A16 times faster at the block rows), "w8a8"
    or "w8a16". See `ops/moe_fp8_choice.py`."""
    value = os.environ.get("DLMRT_FP8_EXPERTS", "measured").lower()
    if value not in ("measured", "w8a8", "w8a16"):
        raise ValueError(f"DLMRT_FP8_EXPERTS={value!r}: expected 'measured', 'w8a8' or 'w8a16'")
    return value


def nvfp4_experts() -> str:
    """DLMRT_NVFP4_EXPERTS: how NVFP4 routed experts run on CUDA: "measured" (default: the W4A16
    kernel, or the weights converted at load to per-channel FP8 on the W8A8 kernel where that
    times faster), "w4a16" or "fp8". See `ops/moe_fp8_choice.py`."""
    value = os.environ.get("DLMRT_NVFP4_EXPERTS", "measured").lower()
    if value not in ("measured", "w4a16", "fp8"):
        raise ValueError(f"DLMRT_NVFP4_EXPERTS={value!r}: expected 'measured', 'w4a16' or 'fp8'")
    return value


def nvfp4_dense() -> str:
    """DLMRT_NVFP4_DENSE: how a dense NVFP4 MLP runs on CUDA: "measured" (default: the W4A16
    kernel where it times faster than bf16 at the block rows, else dequantized), "kernel" (always:
    4.5 bits a weight in memory) or "dequantize" (always bf16). See `ops/nvfp4_choice.py`."""
    value = os.environ.get("DLMRT_NVFP4_DENSE", "measured").lower()
    if value not in ("measured", "kernel", "dequantize"):
        raise ValueError(
            f"DLMRT_NVFP4_DENSE={value!r}: expected 'measured', 'kernel' or 'dequantize'"
        )
    return value


def pdl() -> str:
    """DLMRT_PDL: programmatic dependent launch for our Triton kernels (Hopper+, `kernels/pdl.py`):
    each waits in-kernel (gdc_wait) for its producer before touching memory, then lets its
    successor launch, so launches overlap the previous kernel's tail. "1": every kernel;
    "nogemm": every kernel but the GEMM main loops (dense / GLU / NVFP4 / expert GEMMs); "0"
    (default, off): on an H100 "1" sped the bf16 rounds up but slowed the FP8 round
    (docs/kernels.md). Returns "0", "1" or "nogemm"."""
    value = os.environ.get("DLMRT_PDL", "0").lower()
    if value not in ("0", "1", "nogemm"):
        raise ValueError(f"DLMRT_PDL={value!r}: expected '0', '1' or 'nogemm'")
    return value


def fa4() -> str:
    """DLMRT_FA4: FlashAttention-4 (`flash-attn-4`, optional) for a round's arena attention:
    "auto" (default: where installed and measured faster than our kernel, per shape), "on" (where
    installed and the shape fits, unmeasured) or "off". See `ops/flash_attn4.py`."""
    value = os.environ.get("DLMRT_FA4", "auto").lower()
    if value not in ("auto", "on", "off"):
        raise ValueError(f"DLMRT_FA4={value!r}: expected 'auto', 'on' or 'off'")
    return value


def branch_streams() -> bool:
    """DLMRT_BRANCH_STREAMS: "1" (default) runs a forward's independent branches on two CUDA
    streams in inference (DiffusionGemma's dense MLP beside its routed experts: `ops/branches.py`),
    "0" runs them one after the other on one stream (the before/after switch)."""
    value = os.environ.get("DLMRT_BRANCH_STREAMS", "1")
    if value not in ("0", "1"):
        raise ValueError(f"DLMRT_BRANCH_STREAMS={value!r}: expected '0' or '1'")
    return value == "1"


def vocab_pass() -> bool:
    """DLMRT_VOCAB_PASS: "on" runs a greedy round's vocabulary work of QwenDLM / LLaDA2 (LM head,
    the decoder's statistics, the residual z) as one pass from the final hidden (`ops.vocab_pass`:
    kernels/vocab_pass.py on CUDA); "off" (default: the one pass is slower on an H100) keeps
    the logits and the three separate steps. See `engine/block/vocab_step.py`."""
    value = os.environ.get("DLMRT_VOCAB_PASS", "off").lower()
    if value not in ("on", "off"):
        raise ValueError(f"DLMRT_VOCAB_PASS={value!r}: expected 'on' or 'off'")
    return value == "on"


def deepgemm() -> str:
    """DLMRT_DEEPGEMM: DeepGEMM (`deep_gemm`, optional, built from its repository:
    benchmarks/deepgemm/README.md) for a bf16 linear (`ops/deepgemm.py`): "auto" (where installed
    and measured faster than cuBLAS, per shape), "on" (where installed and the shape fits,
    unmeasured) or "off" (default: DeepGEMM 2.6.1 built on the H100 crashed at its first GEMM,
    benchmarks/deepgemm/README.md; nothing is imported or timed)."""
    value = os.environ.get("DLMRT_DEEPGEMM", "off").lower()
    if value not in ("auto", "on", "off"):
        raise ValueError(f"DLMRT_DEEPGEMM={value!r}: expected 'auto', 'on' or 'off'")
    return value


def canvas_vocab() -> str:
    """DLMRT_CANVAS_VOCAB: which kernel runs DiffusionGemma's vocabulary pass of a canvas step on
    CUDA (`ops.canvas_vocab`): "split" (default: each row's vocabulary split over several
    programs so every SM works, kernels/canvas_vocab_split.py; 0.445 ms against 0.506 at 256 x
    262,144 on an H100), "rows" (one program per canvas row, kernels/canvas_vocab.py) or
    "onepass" (the LM head, the pass and the self-conditioning GEMM in one stream over the
    vocabulary, kernels/canvas_vocab_pass.py; a plain floating-point head only; 8.9 ms against
    1.6 for the three steps on an H100: opt-in). Decided once per canvas program
    (`engine/encoder_decoder/vocab_choice.py`); the CPU runs the torch twins."""
    value = os.environ.get("DLMRT_CANVAS_VOCAB", "split").lower()
    if value not in ("rows", "split", "onepass"):
        raise ValueError(f"DLMRT_CANVAS_VOCAB={value!r}: expected 'rows', 'split' or 'onepass'")
    return value


def canvas_attn() -> str:
    """DLMRT_CANVAS_ATTN: which kernel runs DiffusionGemma's canvas attention on CUDA
    (`ops.canvas_attention`): "whole" (default, faster on an H100: kernels/canvas_attention.py
    with its shipped tiles and key splits) or "split" (the key range split over as many programs
    as fill about two waves of the SMs, kernels/canvas_attention_split.py). Decided once
    (`dlmrt/ops/canvas_launch.py`); the CPU runs the torch twin."""
    value = os.environ.get("DLMRT_CANVAS_ATTN", "whole").lower()
    if value not in ("whole", "split"):
        raise ValueError(f"DLMRT_CANVAS_ATTN={value!r}: expected 'whole' or 'split'")
    return value
