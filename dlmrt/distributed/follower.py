"""A spawned tensor-parallel rank (`dlmrt/distributed/spawn.py` starts it; nothing imports it):
`python -m dlmrt.distributed.follower CONFIG_JSON` builds rank 0's `LLM` from the same
`EngineConfig` and decodes what rank 0 shares until it is released."""

from __future__ import annotations

import json
import sys

from dlmrt.config import EngineConfig
from dlmrt.distributed.spawn import die_with_parent
from dlmrt.llm import LLM


def main(payload: str) -> int:
    die_with_parent()
    cfg = EngineConfig(**json.loads(payload))
    llm = LLM(cfg.model, dtype=cfg.dtype, device=cfg.device, role=cfg.role, mode=cfg.mode,
              fold_commits=cfg.fold_commits, skip_weight_check=cfg.skip_weight_check,
              quantization=cfg.quantization, kv_cache_dtype=cfg.kv_cache_dtype,
              tensor_parallel_size=cfg.tensor_parallel_size)  # fmt: skip
    llm.follow()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
