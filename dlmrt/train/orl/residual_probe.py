"""ResidualProbe: how much the model of an ORL step uses its residual pathway (issue 39).

Its rows are those of the step's replayed states that receive the residual (the adapter's
`receives`: the unresolved rows, or every row of the block for `positions: block`) with z != 0:
a block's first round consumes z = 0, where g(0) = 0 exactly, so counting it would only dilute
the ratio.

    residual_ratio         RMS(alpha * g(z)) / RMS(E[x]) over those rows, at the weights that
                           ran the rollouts (before the step's update):
                           sqrt(sum_i ||alpha g(z_i)||^2 / sum_i ||E[x_i]||^2), x_i the row's
                           canvas token, g before any post-norm (the same rows and width on both
                           sides, so the counts cancel). The paper's Figure 19 diagnostic (0.91 ->
                           1.08 for QwenDLM); a pathway the model does not use reads ~0. Summed
                           from the replay forward's own g(z) and E[x]: no extra forward, no host
                           sync before the step's end.
    update_adapter_output  ||g'(z) - g(z)|| / ||g(z)|| on up to `SAMPLE_ROWS` of those rows
                           (norms over the whole sample; g before and g' after the optimizer
                           step, both in fp32): the step's size on what the adapter feeds the
                           model, unlike ||dW|| / ||W||, which the norm gain's ones dominate.
                           None while g(z) = 0 (a fresh adapter's W_d = 0).

Both are summed across data-parallel ranks (every rank calls `ratio` and `output_update`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dlmrt.models.residual import ResidualAdapter
from dlmrt.train.orl import dist
from dlmrt.train.orl.capture import State

SAMPLE_ROWS = 4096  # rows of the output update: a stable norm, and two cheap adapter forwards


@dataclass
class ResidualProbe:
    adapter: ResidualAdapter
    device: torch.device
    limit: int = SAMPLE_ROWS
    # [3] float64: sum ||alpha g(z)||^2, sum ||E[x]||^2, rows (this rank's replayed rows)
    sums: torch.Tensor = field(init=False)
    sample: torch.Tensor = field(init=False)  # [n <= limit, hidden]: z of this rank's rows
    before: torch.Tensor | None = field(init=False, default=None)  # g(sample) before the step

    def __post_init__(self) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self.sample = torch.zeros(0, self.adapter.down_proj.out_features, device=self.device)

    def rows(self, z: torch.Tensor, unresolved: torch.Tensor) -> torch.Tensor:
        """[M] bool: the rows that receive the residual with z != 0 (z: [M, hidden])."""
        return self.adapter.receives(unresolved) & z.ne(0).any(dim=-1)

    @torch.no_grad()
    def add_replay(
        self, tok_emb: torch.Tensor, z: torch.Tensor, g: torch.Tensor, unresolved: torch.Tensor
    ) -> None:
        """Add a replay forward's noisy rows: E[x] [M, hidden], z, g(z) and the unresolved mask.
        Masked sums, not a boolean index: no host sync inside the replay."""
        w = self.rows(z, unresolved).unsqueeze(-1)
        out = self.adapter.cfg.strength * g.double() * w
        emb = tok_emb.double() * w
        self.sums += torch.stack([out.square().sum(), emb.square().sum(), w.sum().double()])

    @torch.no_grad()
    def keep_rows(self, states: list[State]) -> None:
        """The output update's sample: the z of the states' residual rows, up to `limit`."""
        parts, n = [self.sample], self.sample.shape[0]
        for s in states:
            if n >= self.limit:
                break
            if s.z is None:
                continue
            z = s.z.to(self.device, torch.float32)
            part = z[self.rows(z, s.unresolved.to(self.device))][: self.limit - n]
            parts.append(part)
            n += part.shape[0]
        self.sample = torch.cat(parts)

    def ratio(self) -> dict[str, Any]:
        """{"residual_ratio" (None without rows), "residual_rows"}: all ranks' rows."""
        g2, e2, rows = dist.all_sum(self.sums.tolist(), self.device)
        return {"residual_ratio": (g2 / e2) ** 0.5 if e2 > 0 else None, "residual_rows": int(rows)}

    @torch.no_grad()
    def _outputs(self) -> torch.Tensor:
        if self.sample.shape[0] == 0:  # no rows on this rank: no kernel launch over zero rows
            return torch.zeros_like(self.sample)
        with torch.autocast(self.device.type, enabled=False):  # fp32: steps of ~1e-5 are visible
            return self.adapter(self.sample).float()

    def output_before(self) -> None:
        """g(sample) at the weights before the optimizer step."""
        self.before = self._outputs()

    def output_update(self) -> dict[str, float | None]:
        """{"update_adapter_output"}: after the optimizer step (`output_before` came first)."""
        if self.before is None:
            raise RuntimeError("output_update: call output_before before the optimizer step")
        delta = self._outputs() - self.before
        sums = torch.stack([delta.double().square().sum(), self.before.double().square().sum()])
        num, den = dist.all_sum(sums.tolist(), self.device)
        return {"update_adapter_output": (num / den) ** 0.5 if den > 0 else None}
