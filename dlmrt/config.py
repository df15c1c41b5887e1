"""EngineConfig: what `LLM(...)` and the CLI need to build an engine (frozen; CLI flags derive from it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a device or dtype is needed: `dlmrt --help` stays fast
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")
# KV arena dtypes, as vLLM's --kv-cache-dtype: the model's dtype, or e4m3 (fp8 = fp8_e4m3)
KV_AUTO, KV_FP8, KV_FP8_E4M3 = "auto", "fp8", "fp8_e4m3"
KV_CACHE_DTYPES = (KV_AUTO, KV_FP8, KV_FP8_E4M3)
# Execution modes (docs/execution-modes.md); AUTO: dlmrt/engine/graph/modes.py picks one of the rest
AUTO, BLOCK_GRAPH, ROUND_GRAPH, EAGER = "auto", "block_graph", "round_graph", "eager"
MODES = (AUTO, BLOCK_GRAPH, ROUND_GRAPH, EAGER)
ROLES = ("base", "orl")
# Weight quantization, one meaning per value (EngineConfig.quantization): None (the default, not
# a CLI choice) = the checkpoint's own: its FP8 / NVFP4 weights run quantized, the rest in the
# model dtype; "none" = nothing quantized: every weight dequantized to the model dtype at load;
# "fp8" = the checkpoint's own, and every other linear quantized to FP8 per channel at load.
QUANTIZATIONS = ("none", "fp8")
ACTIVATIONS = ("none", "nvfp4")  # nvfp4: W4A4 emulation of NVFP4 MLPs (docs/quantization.md)
# What a quantized checkpoint's implementation choices favour (docs/quantization.md): "speed" =
# each site as measured (NVFP4 experts may run as FP8); "memory" = NVFP4 stays 4-bit (W4A16).
PREFERENCES = ("speed", "memory")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Engine-wide settings, fixed for the life of an `LLM`."""

    model: str | None = field(
        default=None,
        metadata={"help": "checkpoint directory or cached hub id; None: the embedded demo model"},
    )
    dtype: str | None = field(
        default=None,
        metadata={"help": "float32 | bfloat16 | float16; None: bfloat16 on GPU, float32 on CPU"},
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu | cuda | cuda:N; None: cuda if available"}
    )
    role: str | None = field(
        default=None,
        metadata={
            "help": "base | orl: picks the default decoder; None: orl iff the checkpoint has an adapter"
        },
    )
    mode: str = field(
        default="auto",
        metadata={
            "help": "auto | block_graph | round_graph | eager; auto picks the fastest mode that "
            "passes a start-up self-test (eager on CPU)"
        },
    )
    fold_commits: bool = field(
        default=True,
        metadata={
            "help": "run each block's commit pass (and an editing rule's post-fill check) as the "
            "first half of the next block's first round: one forward less per block, same tokens"
        },
    )
    prefix_reuse: bool = field(
        default=True,
        metadata={
            "help": "keep the KV of each request's prompt and committed blocks (DiffusionGemma: "
            "canvases); a later request reuses the whole blocks (DiffusionGemma: the tokens) "
            "its prompt starts with and prefills only the rest (docs/prefix-reuse.md)"
        },
    )
    stream_rounds: bool = field(
        default=True,
        metadata={
            "help": "hand a streaming request's tokens over every round as they become final "
            "(block_graph: through a ring in pinned host memory the round writes while the graph "
            "runs), not once per block (docs/streaming.md)"
        },
    )
    tensor_parallel_size: int | None = field(
        default=None,
        metadata={
            "help": "tensor-parallel ranks: under torchrun its WORLD_SIZE (None takes it); "
            "without torchrun N > 1 starts ranks 1..N-1 as child processes",
            "aliases": ("--tp",),
        },
    )
    skip_weight_check: bool = field(
        default=False,
        metadata={
            "help": "do not check every weight for NaN/Inf while loading (saves a pass over the "
            "weights of very large models)"
        },
    )

    quantization: str | None = field(
        default=None,
        metadata={
            "help": "none | fp8; unset (None): the checkpoint's own quantization (its FP8 / NVFP4 "
            "weights run quantized, the rest in --dtype); none: every weight dequantized to "
            "--dtype at load; fp8: also quantize the other linear weights per channel at load",
            "choices": QUANTIZATIONS,
        },
    )
    activations: str = field(
        default="none",
        metadata={
            "help": "none | nvfp4: nvfp4 quantize-dequantizes the inputs of an NVFP4 checkpoint's "
            "expert and dense MLP GEMMs per 16 with its static input scales (Blackwell's W4A4 "
            "numerics, emulated: no faster); none: weight-only W4A16",
            "choices": ACTIVATIONS,
        },
    )
    prefer: str = field(
        default="speed",
        metadata={
            "help": "speed | memory: what an NVFP4 checkpoint's implementation choices favour; "
            "speed: each site as measured (on Hopper the routed experts run converted to FP8); "
            "memory: the experts and dense MLPs stay 4-bit on the W4A16 kernels (an FP8 or "
            "bf16 checkpoint loads the same either way)",
            "choices": PREFERENCES,
        },
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={
            "help": "auto | fp8 | fp8_e4m3: the KV arena's dtype; auto: the model's dtype, fp8 "
            "(= fp8_e4m3): e4m3 K and V (half the arena memory and read bytes)",
            "choices": KV_CACHE_DTYPES,
        },
    )

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {self.role!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization: expected one of {', '.join(QUANTIZATIONS)}, "
                f"got {self.quantization!r}"
            )
        if self.activations not in ACTIVATIONS:
            raise ValueError(
                f"activations: expected one of {', '.join(ACTIVATIONS)}, got {self.activations!r}"
            )
        if self.prefer not in PREFERENCES:
            raise ValueError(
                f"prefer: expected one of {', '.join(PREFERENCES)}, got {self.prefer!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype: expected one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.device is not None:
            import torch

            try:
                torch.device(self.device)
            except RuntimeError as e:
                raise ValueError(f"device: {self.device!r} is not a device ({e})") from None
            if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device: {self.device!r} requested but CUDA is not available")

    def torch_device(self) -> torch.device:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype is not None:
            return torch_dtypes()[self.dtype]
        return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32


def torch_dtypes() -> dict[str, torch.dtype]:
    """DTYPE_NAMES -> torch dtypes."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
