"""Talk to `dlmrt serve` with the official `openai` client (pip install openai).

dlmrt serve --model DIR --port 18080         # in another terminal (no --model: the demo model)
python examples/http_client.py               # or: python examples/http_client.py http://HOST:PORT
"""

import sys
import urllib.request

from openai import OpenAI


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18080"
    client = OpenAI(base_url=base + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    print("model:", model)

    # A completion with dlmrt's decode knobs as extra body fields.
    r = client.completions.create(
        model=model,
        prompt="Tom has 23 apples. He buys 15 more and gives away 9. How many apples now?",
        max_tokens=32,
        extra_body={"rule": "threshold", "threshold": 0.9},
    )
    stats = r.model_extra["dlmrt"]
    print(repr(r.choices[0].text), r.choices[0].finish_reason, r.usage)
    print(f"  {stats['denoising_forwards']} forwards, TPF {stats['tokens_per_forward']:.2f}")

    # Chat, streamed: text arrives as blocks commit.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 12+30?"}],
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n  usage: {chunk.usage}")

    # Prometheus metrics.
    with urllib.request.urlopen(base + "/metrics") as res:
        lines = res.read().decode().splitlines()
    print("\n".join(ln for ln in lines if ln.startswith("dlmrt_") and "total" in ln))


if __name__ == "__main__":
    main()
