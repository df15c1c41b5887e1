"""CanvasGrammar: structured output on DiffusionGemma's canvases, decided left to right each step.

DiffusionGemma re-decides every row of a canvas at every step (nothing is frozen: accepted rows
take their sample, the others fresh noise) and commits the last step's argmax
(`dlmrt/decoding/entropy_bound_canvas.py`). So the grammar cannot pin rows as the block engine's
frontier does (`dlmrt/engine/block/structured.py`); it shapes every step instead:

  mask(logits)    each step, before the temperature: the grammar's **chain** over the whole canvas
                  (`Constraint.chain`): row 0 to what the grammar allows after the output so far
                  (the budget included), each row right of it to what it allows after the rows
                  left of it, read as their best allowed tokens among the model's `TOP_K` or
                  the only token the grammar allows (one small read-back, one upload). Sampling, entropies, the accepted set, the done
                  test and the self-conditioning input of the next step all see the masked
                  logits, so a row the grammar forces has zero entropy and is accepted at once.
                  Rows past the chain's end (no allowed token in a row's top K) keep their
                  logits; when the chain ends on a stop token (its document complete there),
                  the rows after it are masked to the stop token.
  settle(logits)  once, on the canvas's last step: the argmax canvas walked through the grammar
                  left to right and consumed; a row whose argmax the grammar refuses (past the
                  chain, or for the budget) takes its best allowed token over the whole
                  vocabulary (one masked argmax), so the committed canvas is always a valid
                  prefix. Once the document is complete the remaining rows are stop tokens.

Once the document is complete, a canvas is stop rows with no step (`done`, `stops`). Logits holding
NaN / inf raise `NonFiniteError` naming the weight (`engine/nonfinite.py`), as unconstrained.
Every committed token keeps the output a valid prefix that can close within `max_new_tokens`
(the `Constraint`'s closing reservation). The grammar runs on the host between a step's forward
and its sampling, so a structured request runs the eager step loop (`dlmrt/reference/canvas.py`).
"""

from __future__ import annotations

import logging

import torch

from dlmrt import reference
from dlmrt.decoding.entropy_bound_canvas import CanvasSettings
from dlmrt.engine import nonfinite
from dlmrt.engine.block.structured import Constraint
from dlmrt.engine.grammar_mask import TOP_K, best_allowed, mask_rows
from dlmrt.outputs import EngineResult

log = logging.getLogger("dlmrt")
inf = float("inf")


class CanvasGrammar:
    def __init__(self, constraint: Constraint, stop_ids: set[int], model: torch.nn.Module) -> None:
        self.c, self.stop_ids, self.model = constraint, stop_ids, model
        self.stop_id = min(stop_ids)
        self.raw: torch.Tensor | None = None  # the last step's logits before the mask

    @property
    def done(self) -> bool:
        """The document is complete: a canvas from here is stop tokens, decided with no step."""
        return self.c.done

    def stops(self, length: int, device: torch.device) -> torch.Tensor:
        return torch.full((length,), self.stop_id, dtype=torch.long, device=device)

    @property
    def host_s(self) -> float:
        return self.c.host_s

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """[L, V] logits with the grammar's chain masked (-inf where a row may not go)."""
        length, vocab = logits.shape
        if nonfinite.flag(logits):  # NaN / inf: nothing of this canvas is committed
            raise nonfinite.error(self.model, "a structured canvas step")
        self.raw = logits
        if self.c.done:  # the document is complete: stop tokens only
            return logits.masked_fill(_all_but(self.stop_id, logits), -inf)
        top = logits.topk(min(TOP_K, vocab), dim=-1).indices.tolist()  # a small read-back
        picks: dict[int, int | None] = {}

        def pick(i: int, ok) -> int | None:
            picks[i] = best_allowed(top[i], ok)
            return picks[i]

        chain = self.c.chain([None] * length, pick)
        out = mask_rows(logits, [i for i, _ in chain], [ok for _, ok in chain])
        end = chain[-1][0] if chain else length
        if picks.get(end) in self.stop_ids:  # the chain's document ends there: stop rows after
            out[end + 1 :] = out[end + 1 :].masked_fill(
                _all_but(self.stop_id, out[end + 1 :]), -inf
            )
        return out

    def settle(self, logits: torch.Tensor) -> torch.Tensor:
        """[L] the canvas to commit: the argmax of `logits` (the last step's, masked), each row
        consumed by the grammar left to right. A refused row takes its best allowed token by the
        step's unmasked logits (the step's mask of that row held on a speculated prefix, so it
        may have hidden the token the grammar needs now)."""
        picks = logits.argmax(dim=-1).tolist()
        raw = self.raw if self.raw is not None else logits
        out: list[int] = []
        for r, tok in enumerate(picks):
            if self.c.done:
                out += [self.stop_id] * (len(picks) - r)
                break
            for _ in range(3):  # a refusal for the budget makes the closing sequence the rule
                if self.c.take([tok]) == 1:
                    break
                ok = self.c.allowed().to(logits.device)
                tok = int(raw[r].float().masked_fill(~ok, float("-inf")).argmax())
            else:
                raise RuntimeError(f"structured canvas: row {r} has no token the grammar takes")
            out.append(tok)
        return torch.tensor(out, dtype=torch.long, device=logits.device)


def _all_but(token: int, logits: torch.Tensor) -> torch.Tensor:
    """Bool like `logits`: True everywhere but column `token`."""
    keep = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[token] = False
    return keep.expand_as(logits)


def generate(
    model: torch.nn.Module,
    prompt: list[int],
    settings: CanvasSettings,
    seed: int,
    rng: str,
    constraint: Constraint,
    kw: dict,
) -> EngineResult:
    """A structured request: the oracle's eager step loop with the grammar between each step's
    forward and its sampling (the mode and why are logged). `kw`: the oracle's keywords (budget,
    stop ids, hooks); a recorder is refused (as on the block engine)."""
    if kw.get("recorder") is not None:
        raise ValueError("response_format: not supported with a recorder or drafts")
    log.info(
        "structured request: mode eager (DiffusionGemma: the grammar masks every step's canvas "
        "on the host, so the steps run one by one on the eager step loop)"
    )
    grammar = CanvasGrammar(constraint, set(kw["stop_ids"]), model)
    res = reference.canvas.generate(
        model, prompt, settings, seed=seed, rng=rng, grammar=grammar, **kw
    )
    res.grammar_ms = grammar.host_s * 1e3
    return res
