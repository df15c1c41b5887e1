"""Tokenizer: `tokenizer.json` through the `tokenizers` library, the chat template through jinja2.

Reads from the checkpoint directory: tokenizer.json (required), tokenizer_config.json (chat
template, mask/eos tokens), chat_template.jinja (preferred over the config's template), and the
stop ids from generation_config.json, else config.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import read_json
from dlmrt.models.config import eos_ids

MASK_TOKEN_NAMES = ("<|MASK|>", "<|mask|>", "[MASK]", "<mask>")


def _token_text(value: Any) -> str | None:
    # tokenizer_config stores special tokens as a string or as an AddedToken dict {"content": ...}.
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(
        self,
        root: str | Path,
        config: dict[str, Any] | None = None,
        generation_config: dict[str, Any] | None = None,
    ) -> None:
        """config / generation_config: config.json / generation_config.json as already parsed
        (the loader's `Checkpoint`); None reads the file from `root` (absent: {})."""
        root = Path(root)
        path = root / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: file not found (dlmrt needs a fast tokenizer.json)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise CheckpointError(f"{path}: unreadable tokenizer ({e})") from e
        self.config = read_json(root / "tokenizer_config.json", required=False) or {}
        model_cfg = (
            config if config is not None else read_json(root / "config.json", required=False) or {}
        )
        gen_cfg = generation_config
        if gen_cfg is None:
            gen_cfg = read_json(root / "generation_config.json", required=False) or {}
        self.chat_template = self._load_template(root)
        self.mask_token_id = self._mask_id(model_cfg)
        # the stop ids the files declare (generation_config.json, else config.json), then, without
        # any, the tokenizer's eos token
        self.declared_stop_ids: set[int] = set(
            eos_ids(gen_cfg.get("eos_token_id"), root / "generation_config.json")
            or eos_ids(model_cfg.get("eos_token_id"), root / "config.json")
        )
        eos_text = _token_text(self.config.get("eos_token"))
        stop = self.declared_stop_ids
        if not stop and eos_text is not None and self._tok.token_to_id(eos_text) is not None:
            stop = {self._tok.token_to_id(eos_text)}
        self.stop_ids: set[int] = set(stop)

    def _load_template(self, root: Path) -> str | None:
        """The chat template, compiled once here so that a broken one fails at load, naming
        its file (chat_template.jinja, else tokenizer_config.json)."""
        source = root / "chat_template.jinja"
        if source.is_file():
            template = source.read_text(encoding="utf-8")
        else:
            source, template = root / "tokenizer_config.json", self.config.get("chat_template")
        if isinstance(template, list):  # list of {"name", "template"}: take "default"
            named = (t for t in template if isinstance(t, dict) and t.get("name") == "default")
            template = next((t.get("template") for t in named), None)
        if template is None:
            return None
        if not isinstance(template, str):
            raise CheckpointError(f"{source}: 'chat_template' must be a string")
        try:
            _environment().from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise CheckpointError(
                f"{source}: the chat template does not compile (line {e.lineno}: {e.message})"
            ) from e
        return template

    def _mask_id(self, model_cfg: dict[str, Any]) -> int | None:
        if model_cfg.get("mask_token_id") is not None:
            return int(model_cfg["mask_token_id"])
        names = [_token_text(self.config.get("mask_token")), *MASK_TOKEN_NAMES]
        for name in names:
            if name is not None and self._tok.token_to_id(name) is not None:
                return self._tok.token_to_id(name)
        return None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def longest_token_chars(self) -> int:
        """Characters of the longest vocabulary entry (added tokens included): one token covers
        no more text than that (byte-level entries are one character per byte), so a text longer
        than N times this cannot fit in N tokens (unless the normalizer deletes characters)."""
        return max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)

    def to_json(self) -> str:
        """The tokenizer.json text (what a grammar engine builds its token trie from)."""
        return self._tok.to_str()

    def encode(self, text: str) -> list[int]:
        # Special tokens in the text (e.g. from the chat template) are recognised as such; no BOS
        # is added here: templates and callers add it explicitly.
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render the checkpoint's chat template (jinja2, sandboxed) to a prompt string."""
        if not self.chat_template:
            raise ValueError("chat: this checkpoint has no chat template")
        try:
            return (
                _environment()
                .from_string(self.chat_template)
                .render(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=_token_text(self.config.get("bos_token")) or "",
                    eos_token=_token_text(self.config.get("eos_token")) or "",
                )
            )
        except jinja2.TemplateError as e:
            raise ValueError(f"chat: the chat template failed to render ({e})") from e
        except (ArithmeticError, TypeError, ValueError, LookupError, RecursionError) as e:
            # the template's own code failing on these messages (e.g. `"x" * 10**20`: an
            # OverflowError): the request's problem, named, not a traceback
            raise ValueError(
                f"chat: the chat template failed to render ({type(e).__name__}: {e})"
            ) from e


def _environment() -> ImmutableSandboxedEnvironment:
    """The sandboxed jinja2 environment chat templates compile and render in (as transformers')."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
