"""The torch twin of the one-pass vocabulary op (kernels/vocab_pass.py): today's three steps.

1. the LM head: logits = h @ W^T in the model dtype (`F.linear`, what `nn.Linear` runs);
2. the decoder's statistics of softmax(logits / T) (`reference.token_stats`: argmax, its
   probability, entropy, log-normaliser; T <= 0 means greedy, statistics at T = 1);
3. the ORL residual z = softmax(logits / T_z) @ E (`reference.softmax_probs`, then the GEMM in
   E's dtype), reusing the log-normaliser of step 2 when T_z is the decoder's temperature, as
   `models.residual.soft_embedding` does.

Op for op what the round computed before the op, so CPU tokens (fp32) do not move. The draw of
a sampled token (temperature > 0) is not part of the op: the round keeps today's inverse-CDF
sampler for it (`decoding.proposal.propose`), which needs the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlmrt.ops import reference


def same_temperature(temperature: float, z_temperature: float) -> bool:
    """Whether the residual's softmax is the decoder's (greedy decoding's is at T = 1)."""
    return z_temperature == (temperature if temperature > 0 else 1.0)


def vocab_pass(
    h: torch.Tensor,
    weight: torch.Tensor,
    embed: torch.Tensor | None,
    temperature: float,
    z_temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """h [rows, hidden] (the final normed hidden), weight [vocab, hidden] (the head), embed
    [vocab, hidden] or None (no residual) -> (argmax, confidence, entropy, log_z, z)."""
    logits = F.linear(h, weight)
    token, confidence, entropy, log_z = reference.token_stats(logits, temperature)
    if embed is None:
        return token, confidence, entropy, log_z, None
    lz = log_z
    if not same_temperature(temperature, z_temperature):
        lz = torch.logsumexp(logits.float() / z_temperature, dim=-1)
    z = reference.softmax_probs(logits, lz, z_temperature, embed.dtype) @ embed
    return token, confidence, entropy, log_z, z
