"""Run under torchrun by tests/distributed/test_torchrun.py: decode a list of requests with
`LLM(..., tensor_parallel_size=N)` on every rank; rank 0 writes what it got as JSON.

    python -m torch.distributed.run --nproc-per-node 2 tp_worker.py JOB.json OUT.json

JOB: {"world": N, "runs": [{"model": DIR, "prompt": [ids], "kwargs": {...}}, ...],
      "exit_rank": R or null, "device": "cpu" | "cuda", "mode": an execution mode}  exit_rank: that rank leaves (exit code 0) after loading, so rank 0
      must report the dead peer (the error goes to OUT as {"error": message}).
"""

from __future__ import annotations

import json
import os
import sys

from dlmrt import LLM
from dlmrt.parallel.group import PeerLost


def main(job_path: str, out_path: str) -> int:
    job = json.loads(open(job_path).read())
    rank = int(os.environ["RANK"])
    llms: dict[str, LLM] = {}
    results = []
    try:
        for run in job["runs"]:
            model = run["model"]
            if model not in llms:
                llms[model] = LLM(
                    model,
                    tensor_parallel_size=job["world"],
                    mode=job.get("mode", "eager"),
                    device=job.get("device", "cpu"),
                    dtype="float32",
                )
            if job.get("exit_rank") == rank:
                os._exit(0)  # a rank that vanishes without a word
            out = llms[model].generate(run["prompt"], **run["kwargs"])
            results.append(
                {
                    "token_ids": out.token_ids,
                    "rounds_per_block": out.rounds_per_block,
                    "finish_reason": out.finish_reason,
                    "mode": out.mode,
                    "cached": out.num_cached_tokens,  # prefix reuse: agreed over the ranks
                    "lm_head_rows": llms[model].model.lm_head.weight.shape[0],
                }
            )
    except PeerLost as e:
        results = {"error": str(e)}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
