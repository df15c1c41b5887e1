"""A round's vocabulary step in one pass: the proposal and the next residual from the final hidden.

Today's form is three steps over [rows, vocab] logits: the LM head writes them, `propose` reads
them for its statistics, `soft_embedding` reads them again for z = softmax(logits / T_z) @ E.
With the one pass (`ops.vocab_pass`) the model returns its final normed hidden instead
(`BlockLM.forward(normed=True)`) and one op streams the vocabulary once for all of it
(kernels/vocab_pass.py on CUDA; on the CPU its twin, the three steps op for op, so CPU tokens do
not move).

Where it applies (`one_pass`, decided once per model and decoding mode, recorded in the choices
registry): DLMRT_VOCAB_PASS on, greedy decoding (a sampled token is drawn by inverse CDF over the
normalised probabilities, which needs the normaliser before the first draw: a second pass, so
sampling keeps the logits and today's sampler), a QwenDLM / LLaDA2 model (`BlockLM`), a plain
floating-point `nn.Linear` head (an FP8 or NVFP4 head keeps its own GEMM and today's steps),
no tensor parallelism (a sharded vocabulary combines its statistics across ranks), and an
unconstrained request (a structured one masks the logits before the rule:
`RoundSpec.allow_one_pass`).
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt import envs, ops
from dlmrt.account import label
from dlmrt.decoding import Proposal
from dlmrt.models.block_lm import BlockLM
from dlmrt.ops import choices
from dlmrt.parallel import group as tp


def _decide(model: nn.Module, temperature: float) -> tuple[str, str]:
    if not envs.vocab_pass():
        return "logits", "DLMRT_VOCAB_PASS=off"
    if temperature > 0:
        return "logits", "sampling draws by inverse CDF from the normalised logits"
    if not isinstance(model, BlockLM):
        return "logits", f"{type(model).__name__} is not a block model"
    if tp.active() is not None:
        return "logits", "tensor parallel: the vocabulary is sharded"
    head = model.lm_head
    plain = type(head) is nn.Linear and head.bias is None
    if not plain or not head.weight.is_floating_point():
        return "logits", f"the LM head is {type(head).__name__}: it keeps its own GEMM"
    return "one pass", f"greedy, {head.weight.dtype} head: op {ops.implementation('vocab_pass')}"


def one_pass(model: nn.Module, temperature: float) -> bool:
    """Whether `model`'s rounds at `temperature` run the vocabulary in one pass (recorded once
    under "round vocabulary (greedy | sampled)")."""
    pick, why = _decide(model, temperature)
    mode = "sampled" if temperature > 0 else "greedy"
    return choices.record(f"round vocabulary ({mode})", pick, why).pick == "one pass"


def propose_one_pass(
    model: BlockLM, h: torch.Tensor, temperature: float, with_z: bool
) -> tuple[Proposal, torch.Tensor | None]:
    """The greedy proposal and (with_z and an adapter) the next residual z from the final normed
    hidden h [rows, hidden]: what `propose` and `soft_embedding` give from the head's logits."""
    adapter = model.adapter
    embed = model.embed_table if with_z and adapter is not None else None
    z_temperature = adapter.cfg.temperature if adapter is not None else 1.0
    weight = model.lm_head.weight
    with label("vocab_pass", h, weight, embed):
        token, confidence, entropy, log_z, z = ops.vocab_pass(
            h, weight, embed, temperature, z_temperature
        )
    return Proposal(token, confidence, entropy, log_z), z
