"""The torch twin of DiffusionGemma's vocabulary pass (kernels/canvas_vocab.py).

The former torch code of the model's logits, the canvas step and the model's soft embedding, op
for op (so CPU tokens do not move): the softcap x = c tanh(r / c) of the LM head's output r in
fp32, z = x / T, softmax in fp32, the counter RNG's inverse-CDF sample
(`entropy_bound_canvas.counter_sample` with its uniform given), argmax, `token_entropy`, and the
next step's self-conditioning probabilities softmax(z cast to the model dtype), in the model dtype.
`canvas_vocab_pass` is the twin of the one pass (kernels/canvas_vocab_pass.py): the LM head, the
above, and the self-conditioning GEMM p @ E, op for op as the step ran them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first token whose cumulative probability exceeds u * total, per row (clamped)."""
    cdf = torch.cumsum(probs, dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    tokens = torch.searchsorted(cdf, target.contiguous(), right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def entropy(z: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z) per row, with torch.distributions.Categorical's exact operations."""
    logp = z - z.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(logp, dim=-1)
    return -(logp.clamp(min=torch.finfo(logp.dtype).min) * probs).sum(-1)


def softcapped(raw: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """The model's fp32 logits from its LM head's output: c tanh(r / c), or r (no softcap)."""
    logits = raw.float()
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


def sc_probs(z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The soft embedding's probabilities of tempered logits z: softmax of z in `dtype`, in fp32,
    cast to `dtype` (the self-conditioning input the model rounds to its dtype first)."""
    return torch.softmax(z.to(dtype).float(), dim=-1, dtype=torch.float32).to(dtype)


def canvas_vocab(
    raw: torch.Tensor,
    softcap: float | None,
    temperature: torch.Tensor,
    u: torch.Tensor,
    sc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(argmax, entropy, sampled) of softmax(softcapped(raw) / T); writes the self-conditioning
    probabilities of z = softcapped(raw) / T into `sc`."""
    z = softcapped(raw, softcap) / temperature
    probs = torch.softmax(z, dim=-1, dtype=torch.float32)
    sampled = inverse_cdf(probs, u)
    argmax = torch.argmax(z, dim=-1)
    h = entropy(z)
    sc.copy_(sc_probs(z, sc.dtype))
    return argmax, h, sampled


def confidence(z: torch.Tensor, argmax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The argmax's self-conditioning probability: softmax of z in `dtype` (the step history's
    confidence)."""
    y = z.to(dtype).float()
    return torch.exp(y.gather(-1, argmax[:, None])[:, 0] - torch.logsumexp(y, dim=-1))


def canvas_vocab_pass(
    h: torch.Tensor,
    weight: torch.Tensor,
    embed: torch.Tensor,
    softcap: float | None,
    temperature: torch.Tensor,
    u: torch.Tensor,
    soft: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(argmax, entropy, sampled, confidence) from the final normed hidden h: the head
    `F.linear(h, weight)`, `canvas_vocab` of its output, and the next step's self-conditioning
    embedding sc @ embed (before the sqrt(hidden) scale) written into `soft`."""
    raw = F.linear(h, weight)
    sc = torch.empty(raw.shape, dtype=embed.dtype, device=raw.device)
    argmax, entropy_, sampled = canvas_vocab(raw, softcap, temperature, u, sc)
    soft.copy_(sc @ embed)
    conf = confidence(softcapped(raw, softcap) / temperature, argmax, embed.dtype)
    return argmax, entropy_, sampled, conf
