"""The oracles: the plain, slow specifications the engines are tested against, token for token.

    block.generate    block style (QwenDLM, LLaDA2): no KV cache, no graphs, no static buffers;
                      every round recomputes the whole sequence under a dense block-causal mask.
    canvas.generate   encoder-decoder style (DiffusionGemma): transformers' loop (a growing context
                      cache, torch's or the counter noise), no graphs, no static buffers.

They share with the engines only the model, the layouts (`dlmrt/blocks.py`,
`dlmrt/canvas_loop.py`) and the decoding rules, each tested on its own; they import nothing from
`dlmrt.engine`.
"""

from dlmrt.reference import block, canvas

__all__ = ["block", "canvas"]
