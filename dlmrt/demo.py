"""The embedded default model: a tiny QwenDLM + ORL checkpoint built deterministically on first use.

`dlmrt generate` without --model uses it. Its weights are RANDOM (seeded): it exercises the whole
pipeline (checkpoint loading, tokenizer, chat template, ORL residual, entropy-budget decoding) but
its text is gibberish. A trained demo model replaces it in a later release.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from dlmrt import envs

DEMO_NAME = "demo-qwen-dlm-orl-v1"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "model_type": "sdar",
    "vocab_size": 260,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "block_size": 32,
    "bos_token_id": 256,
    "eos_token_id": 256,
    "mask_token_id": 259,
    "orl_residual": {
        "intermediate_size": 192,
        "input_scale": 1.0,
        "output_scale": 1.0,
        "strength": 1.0,
        "post_norm_scale": 0.02,
        "positions": "masked",
        "temperature": 1.0,
    },
}


def demo_model_path() -> Path:
    """Return the demo checkpoint directory, building it first if needed (atomic, deterministic)."""
    target = envs.cache_dir() / DEMO_NAME
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
    try:
        write_demo_checkpoint(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process built it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_demo_checkpoint(out: Path) -> None:
    """Write config, seeded random weights, a byte-level tokenizer and the ChatML template."""
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [256, 258]}, indent=2))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHAT_TEMPLATE,
                "eos_token": "<|im_end|>",
                "mask_token": "<|MASK|>",
            },
            indent=2,
        )
    )
    _byte_tokenizer().save(str(out / "tokenizer.json"))
    save_file(_random_weights(), str(out / "model.safetensors"))


def _byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)  # ids 256..259
    return tok


def _random_weights() -> dict[str, torch.Tensor]:
    from dlmrt.models.config import model_config_from_hf
    from dlmrt.models.qwen_dlm import QwenDLM

    gen = torch.Generator().manual_seed(1234)
    with torch.device("meta"):
        model = QwenDLM(model_config_from_hf(CONFIG, Path("demo/config.json")))
    weights = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(p.shape)
        else:
            weights[name] = torch.randn(p.shape, generator=gen) * (0.5 if "embed" in name else 0.08)
    return weights
