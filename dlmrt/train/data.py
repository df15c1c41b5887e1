"""SFT data: task problems -> token ids (chat or raw prompt) -> packed [clean | noisy] rows.

An example is formatted the way `dlmrt generate` will see it:
  chat  prompt = ChatML(user: question) + "<|im_start|>assistant\\n",
        response = solution + <|im_end|>
  raw   prompt = question,  response = " " + solution + <|endoftext|>
and the response is padded with <|endoftext|> to the end of its block. The padding is trained
(the decoder must fill the rest of the last block after the stop token, confidently); the engine
cuts the output after the first stop id. Whether an example is chat is a deterministic function of
its seed (fraction `chat_fraction`). Prompt and response are tokenised separately, as the engine
sees them (prompt ids, then generated ids).

A step is `grad_accum` packs; a pack is one row of exactly `pack_rows` rows: whole examples in
train-seed order (`masks.py` has the layout), pad rows at the end. Pack j depends only on
(run, j) (`SFTPacks`), so DataLoader workers build packs in parallel and a resumed run reads
the same examples with the same noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dlmrt.tokenizer import Tokenizer
from dlmrt.train.masks import MaskMeta
from dlmrt.train.noise import mask_blocks
from dlmrt.train.tokenizer import ENDOFTEXT, IM_END, MASK

IGNORE = -100


@dataclass(frozen=True, slots=True)
class Example:
    prompt: list[int]
    response: list[int]  # padded: len(prompt) + len(response) is a multiple of the block size


@dataclass(frozen=True, slots=True)
class Batch:
    input_ids: torch.Tensor  # [N] long
    positions: torch.Tensor  # [N] long
    labels: torch.Tensor  # [N] long: the clean token on masked noisy rows, else IGNORE
    loss_rows: torch.Tensor  # [M] long: the rows with a label (computed on the host: no sync)
    ratio: torch.Tensor  # [N] float: mask ratio k/n of the row's block (noisy rows), else 0
    response: torch.Tensor  # [N] bool: noisy rows holding a response token (masked or not)
    meta: MaskMeta
    num_examples: int
    num_masked: int  # loss tokens (len(loss_rows))
    num_response: int  # response tokens in the noisy blocks, masked or not

    def to(self, device: torch.device) -> Batch:
        """Copy to `device` (asynchronous from pinned memory: see `pin_memory`)."""
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        return self._map(torch.Tensor.pin_memory)

    def _map(self, fn) -> Batch:
        m = self.meta
        return Batch(
            fn(self.input_ids),
            fn(self.positions),
            fn(self.labels),
            fn(self.loss_rows),
            fn(self.ratio),
            fn(self.response),
            MaskMeta(fn(m.doc), fn(m.noisy), fn(m.block)),
            self.num_examples,
            self.num_masked,
            self.num_response,
        )


def is_chat(seed: int, chat_fraction: float) -> bool:
    return random.Random(f"chat-{seed}").random() < chat_fraction


def prompt_text(tokenizer: Tokenizer, question: str, chat: bool) -> str:
    if chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": question}])
    return question


class Formatter:
    """Problem -> Example, with the chat template rendered once (as prefix + question + suffix)."""

    SENTINEL = "\x00question\x00"

    def __init__(self, tokenizer: Tokenizer, block: int) -> None:
        self.tokenizer, self.block = tokenizer, block
        tok = tokenizer._tok
        self.im_end, self.eos = tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)
        self.mask_id, self.pad_id = tok.token_to_id(MASK), self.eos
        rendered = prompt_text(tokenizer, self.SENTINEL, chat=True)
        if rendered.count(self.SENTINEL) != 1:
            raise ValueError("chat template: cannot split around the user message")
        self.chat_prefix, self.chat_suffix = rendered.split(self.SENTINEL)

    def encode(self, question: str, solution: str, chat: bool) -> Example:
        encode = self.tokenizer.encode
        if chat:
            prompt = encode(self.chat_prefix + question + self.chat_suffix)
            response = encode(solution) + [self.im_end]
        else:
            prompt = encode(question)
            response = encode(" " + solution) + [self.eos]
        pad = -(len(prompt) + len(response)) % self.block
        return Example(prompt, response + [self.eos] * pad)


def example_rows(prompt_len: int, response_len: int, block: int) -> int:
    """Rows an example takes in a packed row: clean blocks 0..K-2, noisy blocks f..K-1."""
    k = (prompt_len + response_len) // block
    return (k - 1) * block + (k - prompt_len // block) * block


def pack(
    examples: list[Example],
    block: int,
    length: int,
    mask_id: int,
    pad_id: int,
    generator: torch.Generator,
) -> Batch:
    """One packed row of `length` rows with fresh noise on every noisy block."""
    ids, pos, doc, noisy, cand, group = [], [], [], [], [], []
    row = groups = 0
    for d, ex in enumerate(examples):
        x = np.asarray(ex.prompt + ex.response, dtype=np.int64)
        p, k = len(ex.prompt), len(x) // block
        first = p // block
        clean, n = (k - 1) * block, (k - first) * block
        ids += [x[:clean], x[first * block :]]
        pos += [np.arange(clean), np.arange(first * block, k * block)]
        doc.append(np.full(clean + n, d, dtype=np.int32))
        noisy.append(np.arange(clean + n) >= clean)
        resp = np.arange(p - first * block, n)  # noisy rows after the prompt tail
        cand.append(row + clean + resp)
        group.append(groups + resp // block)
        row, groups = row + clean + n, groups + k - first
    if row > length:
        raise ValueError(f"pack: {row} rows do not fit in a row of {length}")
    pads = length - row
    ids.append(np.full(pads, pad_id, dtype=np.int64))
    pos.append(np.zeros(pads, dtype=np.int64))
    doc.append(np.arange(-row - 1, -length - 1, -1, dtype=np.int32))  # a pad is its own document
    noisy.append(np.zeros(pads, dtype=bool))

    input_ids = torch.from_numpy(np.concatenate(ids))
    positions = torch.from_numpy(np.concatenate(pos))
    cand_t = torch.from_numpy(np.concatenate(cand)) if cand else torch.zeros(0, dtype=torch.long)
    group_t = torch.from_numpy(np.concatenate(group)) if group else cand_t
    masked, ratio_c = mask_blocks(group_t, groups, generator)
    loss_rows = cand_t[masked]  # ascending
    labels = torch.full((length,), IGNORE, dtype=torch.long)
    labels[loss_rows] = input_ids[loss_rows]
    input_ids[loss_rows] = mask_id
    ratio = torch.zeros(length)
    ratio[cand_t] = ratio_c
    response = torch.zeros(length, dtype=torch.bool)
    response[cand_t] = True
    meta = MaskMeta(
        torch.from_numpy(np.concatenate(doc)),
        torch.from_numpy(np.concatenate(noisy)),
        (positions // block).to(torch.int32),
    )
    n_ex, n_loss, n_cand = len(examples), len(loss_rows), len(cand_t)
    return Batch(
        input_ids, positions, labels, loss_rows, ratio, response, meta, n_ex, n_loss, n_cand
    )


def pack_seed(seed: int, index: int) -> int:
    """Seed of the noise of pack `index` of a run with `seed`."""
    return (seed * 1_000_003 + index) % 2**63


class SFTPacks(torch.utils.data.Dataset):
    """Pack j of a run, a pure function of (run, j): resumable, and buildable by any worker.

    Pack j reads the train problems of seeds [j * rows, (j + 1) * rows) in order and takes them
    while they fit in `rows` rows (each example takes >= 2 blocks, so the range never runs out);
    the rest of the range is skipped. Its noise comes from a generator seeded by (seed, j).
    Holds only picklable settings: the tokenizer is opened lazily in each worker process.
    """

    def __init__(
        self,
        task: str,
        run_dir: str | Path,
        block: int,
        rows: int,
        chat_fraction: float,
        seed: int,
    ) -> None:
        self.task, self.run_dir, self.block, self.rows = task, str(run_dir), block, rows
        self.chat_fraction, self.seed = chat_fraction, seed
        self._fmt: Formatter | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fmt": None}

    @property
    def formatter(self) -> Formatter:
        if self._fmt is None:
            self._fmt = Formatter(Tokenizer(self.run_dir), self.block)
        return self._fmt

    def examples(self, index: int) -> list[Example]:
        from dlmrt.tasks import get_task

        fmt, rows, examples = self.formatter, 0, []
        start = index * self.rows
        for problem in get_task(self.task).iter_split("train", start):
            if problem.seed >= start + self.rows:
                raise RuntimeError(f"pack {index}: train seeds exhausted")  # cannot happen
            chat = is_chat(problem.seed, self.chat_fraction)
            ex = fmt.encode(problem.question, problem.solution, chat)
            need = example_rows(len(ex.prompt), len(ex.response), self.block)
            if need > self.rows:
                raise ValueError(
                    f"pack_rows: {self.rows} rows cannot hold one example ({need} rows, train "
                    f"seed {problem.seed}); raise pack_rows"
                )
            if rows + need > self.rows:
                return examples
            examples.append(ex)
            rows += need
        raise AssertionError("unreachable")

    def __getitem__(self, index: int) -> Batch:
        fmt = self.formatter
        gen = torch.Generator().manual_seed(pack_seed(self.seed, index))
        return pack(self.examples(index), self.block, self.rows, fmt.mask_id, fmt.pad_id, gen)
