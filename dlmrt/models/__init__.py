"""Model families: one registry entry per family drives loading (`dlmrt/loading/checkpoint.py`) and `LLM`.

A `Family` names its model class and config parser (imported lazily), its decoding style
(`dlmrt/rules.py`: which engine runs it), whether it routes through the MoE ops (graph modes then
need their Triton kernels), and its default rules. Each HF `architectures` name maps to a family.
Stop ids and the chat template are the tokenizer's (`dlmrt/tokenizer.py`: generation_config.json,
then config.json, then the tokenizer files), the same convention for every family, except that a
family's own reading of config.json (its parsed `eos_token_ids` / `mask_token_id`: LLaDA2's
defaults) comes before the tokenizer files (`LLM`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from dlmrt.rules import BLOCK, ENCODER_DECODER


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    model: str  # "module:Class"
    config_parser: str  # "module:function" (HF config dict, path) -> frozen config dataclass
    style: str  # BLOCK | ENCODER_DECODER: the engine that runs it
    moe: bool  # routes through ops.moe_*: graph modes need the Triton MoE kernels
    base_rule: str  # default rule without an ORL adapter (or role="base")
    orl_rule: str  # default rule with one (or role="orl")
    orl_needs_adapter: bool  # role="orl" on a checkpoint without an adapter is an error
    # (DiffusionGemma has no adapter: its role "orl" selects recorded decoder settings)

    def default_rule(self, role: str | None, has_adapter: bool) -> str:
        """The rule a request gets when it names none; ValueError for an impossible role."""
        if role == "orl" and not has_adapter and self.orl_needs_adapter:
            raise ValueError(
                f"role='orl' needs an ORL checkpoint ('orl_residual' in config.json and the "
                f"adapter's weights); this is a Base {self.name} checkpoint"
            )
        orl = role == "orl" or (role is None and has_adapter)
        return self.orl_rule if orl else self.base_rule

    def resolve(self) -> tuple[type, Any]:
        """(model class, config parser), imported now."""
        (mmod, mcls), (pmod, pfn) = self.model.split(":"), self.config_parser.split(":")
        return getattr(importlib.import_module(mmod), mcls), getattr(
            importlib.import_module(pmod), pfn
        )


QWEN_DLM = Family(
    "QwenDLM",
    "dlmrt.models.qwen_dlm:QwenDLM",
    "dlmrt.models.config:model_config_from_hf",
    BLOCK,
    moe=False,
    base_rule="threshold",
    orl_rule="entropy_budget",
    orl_needs_adapter=True,
)
LLADA2 = Family(
    "LLaDA2",
    "dlmrt.models.llada2:LLaDA2",
    "dlmrt.models.llada2_config:llada2_config_from_hf",
    BLOCK,
    moe=True,
    base_rule="llada_editing",
    orl_rule="llada_editing",
    orl_needs_adapter=True,
)
DIFFUSION_GEMMA = Family(
    "DiffusionGemma",
    "dlmrt.models.diffusion_gemma:DiffusionGemma",
    "dlmrt.models.diffusion_gemma_config:diffusion_gemma_config_from_hf",
    ENCODER_DECODER,
    moe=True,
    base_rule="entropy_bound_canvas",
    orl_rule="entropy_bound_canvas",
    orl_needs_adapter=False,
)
ARCHITECTURES: dict[str, Family] = {
    "SDARForCausalLM": QWEN_DLM,
    "Qwen3ForCausalLM": QWEN_DLM,
    "LLaDA2MoeModelLM": LLADA2,
    "DiffusionGemmaForBlockDiffusion": DIFFUSION_GEMMA,
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def family(architecture: str) -> Family:
    """The family of an HF architecture name; KeyError if unknown."""
    return ARCHITECTURES[architecture]


def resolve(architecture: str) -> tuple[type, Any]:
    """Return (model class, config parser) for an HF architecture name; KeyError if unknown."""
    return ARCHITECTURES[architecture].resolve()


def family_of(model: Any) -> Family:
    """The family of a built model (by its class)."""
    for fam in dict.fromkeys(ARCHITECTURES.values()):
        if fam.model.split(":")[1] == type(model).__name__:
            return fam
    raise ValueError(f"model: {type(model).__name__} is not a registered dlmrt model family")
