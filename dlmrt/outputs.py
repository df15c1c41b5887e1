"""GenerationOutput: what one request returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GenerationOutput:
    """Result of one request.

    tokens_per_forward = generated tokens / (denoising + commit forwards): every forward after the
    prompt prefill. With commit folding (the default) no commit pass runs on its own (it rides in a
    denoising forward), so this is tokens per denoising forward; unfolded, the commits count too.
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
        forwards = self.num_denoising_forwards + self.num_commit_forwards
        return len(self.token_ids) / max(forwards, 1)

    @property
    def request_tps(self) -> float:
        return len(self.token_ids) / self.request_time_s if self.request_time_s > 0 else 0.0
