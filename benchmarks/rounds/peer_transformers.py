"""DiffusionGemma side by side: transformers' `generate` against dlmrt on the same checkpoint.

    python -m benchmarks.rounds.peer_transformers [--layers 12] [--steps 16] [--new-tokens 1024]
        [--modes block_graph eager] [--out benchmarks/results/peer_transformers.json]
    python -m benchmarks.rounds.peer_transformers --tiny --device cpu     # a smoke test (tiny widths)

One random-weight checkpoint (DiffusionGemma-26B-A4B widths: hidden 2816, 16 heads, sliding
head 256 x 8 KV heads, full head 512 x 2 KV heads, 128 experts x 704, top-8, vocab 262144;
`--layers` of them, 5 sliding : 1 full), written by transformers' `save_pretrained` and loaded by
both (with a word-level tokenizer over the whole vocabulary: dlmrt needs a tokenizer.json). Every
canvas runs exactly `--steps` denoising steps (ignore_eos; confidence threshold 1e-9: the mean
entropy never falls below it, so no canvas stops early), so both do the same work: tokens/s and ms per decoder step (wall time over the
request / (canvases x steps)) side by side, the same prompt, in one run. Tokens are not compared
(transformers draws with torch's RNG, dlmrt's graph modes with its counter RNG).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import command_line, write_result
from dlmrt import LLM
from dlmrt.model_shapes import diffusion_gemma_26b, layer_widths
from dlmrt.models.diffusion_gemma_config import FULL as F
from dlmrt.models.diffusion_gemma_config import SLIDING as S


def _full_widths() -> dict:
    """DiffusionGemma-26B-A4B's widths (`dlmrt/model_shapes.py`) under transformers' names."""
    dg = diffusion_gemma_26b()
    (head, kv), (full_head, full_kv) = layer_widths(dg, S), layer_widths(dg, F)
    return dict(
        vocab_size=dg.vocab_size,
        hidden_size=dg.hidden_size,
        intermediate_size=dg.intermediate_size,
        num_attention_heads=dg.num_attention_heads,
        num_key_value_heads=kv,
        head_dim=head,
        global_head_dim=full_head,
        num_global_key_value_heads=full_kv,
        sliding_window=dg.sliding_window,
        num_experts=dg.num_experts,
        moe_intermediate_size=dg.moe_intermediate_size,
    )


TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=2,
    sliding_window=16,
    num_experts=8,
    moe_intermediate_size=32,
)


def text_config(layers: int, tiny: bool) -> dict:
    dg = diffusion_gemma_26b(layers)
    rope = {
        S: {"rope_type": "default", "rope_theta": dg.rope[S].theta},
        F: {
            "rope_type": "proportional",
            "partial_rotary_factor": dg.rope[F].rotary_factor,
            "rope_theta": dg.rope[F].theta,
        },
    }
    return dict(
        TINY if tiny else _full_widths(),
        num_hidden_layers=layers,
        layer_types=list(dg.layer_types),
        top_k_experts=dg.top_k_experts,
        max_position_embeddings=8192,
        rope_parameters=rope,
        use_bidirectional_attention="vision",
        final_logit_softcapping=dg.final_logit_softcapping,
    )


def write_checkpoint(path: Path, layers: int, tiny: bool, device: str):
    """A random transformers DiffusionGemma saved at `path`; returns the transformers model."""
    import transformers.models.diffusion_gemma as dg

    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    cfg = dg.DiffusionGemmaConfig(
        text_config=text_config(layers, tiny),
        vision_config=vision,
        canvas_length=32 if tiny else diffusion_gemma_26b().canvas_length,
    )
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        hf = dg.DiffusionGemmaForBlockDiffusion(cfg).to(dtype).eval()
    hf.save_pretrained(path)
    write_tokenizer(path, cfg.text_config.vocab_size)
    gen = json.loads((path / "generation_config.json").read_text())
    gen.update(eos_token_id=[1], pad_token_id=0)
    (path / "generation_config.json").write_text(json.dumps(gen))
    return hf


def write_tokenizer(path: Path, vocab: int) -> None:
    """A word-level tokenizer naming every id (`t<i>`): the text is never looked at here."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(args) -> dict:
    knobs = dict(max_denoising_steps=args.steps, confidence_threshold=1e-9)  # never stops early
    prompt = torch.randint(
        2, 500, (args.prompt_tokens,), generator=torch.Generator().manual_seed(1)
    )
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dg"
        hf = write_checkpoint(path, args.layers, args.tiny, args.device)
        ids = prompt[None].to(args.device)

        def peer():
            with torch.inference_mode():
                hf.generate(ids, max_new_tokens=args.new_tokens, **knobs)

        peer()  # warm-up
        out["transformers"] = timed(peer)
        hf = None  # free its weights before dlmrt loads its own copy
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        for mode in args.modes:
            llm = LLM(path, device=args.device, mode=mode, prefix_reuse=False)  # cold prefills
            kw = dict(max_new_tokens=args.new_tokens, ignore_eos=True, **knobs)
            llm.generate(prompt.tolist(), **kw)  # warm-up (graph capture)
            out[f"dlmrt_{mode}"] = timed(lambda llm=llm, kw=kw: llm.generate(prompt.tolist(), **kw))
            llm = None
    canvases = -(-args.new_tokens // (32 if args.tiny else 256))
    return {
        name: {"seconds": round(s, 4), "tokens_per_s": round(args.new_tokens / s, 1),
               "ms_per_step": round(s / (canvases * args.steps) * 1e3, 3)}
        for name, s in out.items()
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["block_graph", "eager"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny widths (a CPU smoke test)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args(argv)
    results = run(args)
    peer = results["transformers"]["tokens_per_s"]
    for name, r in results.items():
        print(
            f"{name:>20}  {r['tokens_per_s']:>9.1f} tok/s  {r['ms_per_step']:>8.3f} ms/step  "
            f"{r['tokens_per_s'] / peer:.2f}x transformers"
        )
    if args.out:
        payload = {
            "benchmark": "peer_transformers",
            "command": command_line(),
            "config": vars(args),
            "results": results,
        }
        write_result(args.out, payload, args.git_revision)
    return results


if __name__ == "__main__":
    main()
