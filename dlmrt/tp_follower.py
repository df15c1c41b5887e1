"""A spawned tensor-parallel rank (`dlmrt/distributed/spawn.py` starts it; nothing imports it):
`python -m dlmrt.tp_follower CONFIG_JSON` builds rank 0's `LLM` from the same
`EngineConfig` fields (they are `LLM`'s arguments) and decodes what rank 0 shares until released."""

from __future__ import annotations

import json
import sys

from dlmrt.distributed.spawn import die_with_parent
from dlmrt.llm import LLM


def main(payload: str) -> int:
    die_with_parent()
    LLM(**json.loads(payload)).follow()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
