"""Offline generation with the Python API.

python examples/offline_generate.py                      # the embedded demo model (trained on arithmetic word problems)
python examples/offline_generate.py /models/QwenDLM-4B-ORL "Write a prime checker."
"""

import sys

from dlmrt import LLM


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    prompt = sys.argv[2] if len(sys.argv) > 2 else "What is 12+30?"
    llm = LLM(model)
    out = llm.generate(prompt, chat=True, max_new_tokens=128)
    print(out.text)
    print(
        f"{len(out.token_ids)} tokens ({out.finish_reason}), "
        f"{out.num_denoising_forwards} denoising forwards, TPF {out.tokens_per_forward:.2f}, "
        f"{out.request_tps:.0f} tokens/s, rounds per block {out.rounds_per_block}"
    )


if __name__ == "__main__":
    main()
