"""The engine: one request's token ids in, its generated token ids out, on static device memory.

    graph/            the mode machinery, knowing nothing of model families: mode selection
                      (`modes.py`), capture helpers, the conditional WHILE node, the three runners
                      over one Loop/Pass interface (`loop.py`), the workspace (arena growth, graph
                      pool, the LRU program cache)
    block/            block style (QwenDLM, LLaDA2): rounds over blocks of B rows, commit folding
    encoder_decoder/  encoder-decoder style (DiffusionGemma): denoising steps over canvases
    kv_cache.py       the static arenas of both styles
    prefix.py         both styles: the arena rows a request leaves for the next one to reuse

What the engine owns: device buffers, the arena, captured graphs, the per-request host loop and
its counters (`EngineResult`). What it must never do: read text or tokenizers, load checkpoints,
parse configs or requests, pick a family's defaults (`LLM` and the family registry do), or look
inside a model's adapter (it asks `ResidualAdapter.receives` / `filled_block_is_clean`). It imports
nothing from `llm`, `cli`, `server`, `bench` or `train` (tests/test_layout.py).
"""

from dlmrt.engine.block.engine import BlockEngine
from dlmrt.engine.encoder_decoder.engine import EncoderDecoderEngine
from dlmrt.engine.graph.modes import MODES, select_mode

__all__ = ["MODES", "BlockEngine", "EncoderDecoderEngine", "select_mode"]
