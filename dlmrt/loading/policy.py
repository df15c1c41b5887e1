"""Which parameters may run in FP8: one table for every family, the loader and the writers.

Names are matched on their tail, so the same rules hold for a model's state_dict names
(`model.layers.0.self_attn.q_proj.weight`, `model.layers.1.mlp.experts.gate_proj`) and for the
stored names of a checkpoint (`model.decoder.layers.0...`, per-expert `mlp.experts.3.gate_proj.weight`).
The first matching rule wins; a name no rule matches is not a linear projection (embeddings, norms,
scalars) and stays in the compute dtype.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

ADAPTER = "ORL residual adapter (bf16, as in the paper)"
SELF_CONDITIONING = "self-conditioning MLP (bf16, as in the paper)"
ROUTER = "router"
UNQUANTIZED_LINEARS = (ADAPTER, SELF_CONDITIONING, ROUTER)  # linear modules that stay bf16

# (pattern searched in the name, runs in FP8, why). Exclusions come first: they override the
# projection names they contain (the adapter and the self-conditioning MLP have gate/up/down too).
RULES: tuple[tuple[re.Pattern[str], bool, str], ...] = tuple(
    (re.compile(p), fp8, why)
    for p, fp8, why in (
        (r"(^|\.)residual_adapter\.", False, ADAPTER),
        (r"(^|\.)self_conditioning\.", False, SELF_CONDITIONING),
        (r"(^|\.)(embed_tokens|word_embeddings)\.", False, "embedding"),
        (r"norm\.weight$", False, "norm"),
        (r"(^|\.)(router\.proj|mlp\.gate)\.weight$", False, ROUTER),
        (
            r"(^|\.)experts\.(\d+\.)?(gate_proj|up_proj|down_proj|gate_up_proj)(\.weight)?$",
            True,
            "routed experts",
        ),
        (
            r"(^|\.)(self_attn\.(q|k|v|o)_proj|attention\.(query_key_value|dense))\.weight$",
            True,
            "attention projection",
        ),
        (
            r"(^|\.)mlp\.(shared_experts\.)?(gate_proj|up_proj|down_proj)\.weight$",
            True,
            "dense MLP",
        ),
        (r"^lm_head\.weight$", True, "lm_head"),
    )
)
OTHER = "not a linear projection"


def classify(name: str) -> tuple[bool, str]:
    """(whether `name` is an FP8 candidate, the reason) for a parameter or stored tensor name."""
    for pattern, fp8, why in RULES:
        if pattern.search(name):
            return fp8, why
    return False, OTHER


def is_candidate(name: str) -> bool:
    return classify(name)[0]


def module_names(name: str) -> tuple[str, ...]:
    """The module names an ignore pattern may name for a tensor: `a.b.weight` -> (`a.b`,);
    a stacked parameter `a.experts.gate_up_proj` -> (`a.experts.gate_up_proj`, `a.experts`)."""
    if name.endswith(".weight"):
        return (name.removesuffix(".weight"),)
    return (name, name.rpartition(".")[0])


def matches(patterns: Iterable[str], name: str) -> str | None:
    """The first ignore pattern naming this tensor's module, or None.

    `re:REGEX` is a regular expression matched at the start of the module name (compressed-tensors'
    `ignore`); anything else is an fnmatch pattern (ModelOpt's `exclude_modules`: `lm_head`,
    `*mlp.gate*`), so a plain module name matches itself."""
    modules = module_names(name)
    for p in patterns:
        for m in modules:
            if p.startswith("re:") and re.match(p[3:], m):
                return p
            if not p.startswith("re:") and fnmatch.fnmatchcase(m, p):
                return p
    return None
