"""The torch twin of DiffusionGemma's vocabulary pass (kernels/canvas_vocab.py).

The canvas step's former torch code, op for op (so CPU tokens do not move): z = logits / T,
softmax in fp32, the counter RNG's inverse-CDF sample (`entropy_bound_canvas.counter_sample` with
its uniform given), argmax, `token_entropy`, and z cast into the self-conditioning buffer.
"""

from __future__ import annotations

import torch


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


def canvas_vocab(
    logits: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor, sc: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(argmax, entropy, sampled) of softmax(logits / T); writes logits / T into `sc`."""
    z = logits / temperature
    probs = torch.softmax(z, dim=-1, dtype=torch.float32)
    sampled = inverse_cdf(probs, u)
    argmax = torch.argmax(z, dim=-1)
    h = entropy(z)
    sc.copy_(z.to(sc.dtype))
    return argmax, h, sampled
