"""GenerationOutput: what one request returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GenerationOutput:
    """Result of one request.

    tokens_per_forward (TPF) = generated tokens / denoising forwards, the paper's definition (commit
    and encoder passes are not charged; `num_commit_forwards` counts them). With commit folding (the
    default) a joint pass counts as one denoising forward: folding a plain commit leaves TPF as it
    was (the saving shows as num_commit_forwards == 0 and in request_tps); folding an editing
    rule's post-fill check (one forward instead of two) raises it.
    request_time_s covers tokenisation, prefill, decoding and host overhead (not model loading);
    request_tps = generated tokens / request_time_s.
    """

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (a stop id was generated; kept as the last token) or "length"
    prompt_tokens: int
    num_denoising_forwards: int
    num_commit_forwards: int
    num_prefill_forwards: int
    request_time_s: float
    rounds_per_block: list[int] = field(default_factory=list)
    mode: str = "eager"  # execution mode that ran the request (eager when a recorder was given)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / max(self.num_denoising_forwards, 1)

    @property
    def request_tps(self) -> float:
        return len(self.token_ids) / self.request_time_s if self.request_time_s > 0 else 0.0
