"""The playground page in a real browser: headless Chromium (driven over the DevTools protocol,
tests/browser.py) loads `/` from a live `dlmrt serve` (uvicorn on loopback, the embedded demo
model), types a prompt, presses Generate and must end with the server's answer and stats on the
page. A screenshot of one replayed round is saved under $DLMRT_TEST_ARTIFACTS (default:
test-artifacts/). Skipped where Chromium is not installed (Debian: `apt-get install chromium`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from browser import BROWSER, Browser
from conftest import serve_in_thread

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import dlmrt  # noqa: E402
from dlmrt.server.app import build_app  # noqa: E402

pytestmark = pytest.mark.skipif(BROWSER is None, reason="Chromium is not installed")
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Tom has 23 apples. He buys 15 more and gives away 9. How many apples now?"
KNOBS = {"max_tokens": 48, "rule": "threshold", "threshold": 0.999}  # a few rounds per block


@pytest.fixture(scope="module")
def url():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with serve_in_thread(build_app(dlmrt.LLM(device="cpu"))) as base:  # the demo model
        yield base
    torch.set_num_threads(threads)


def _fill(page: Browser) -> None:
    """Type the prompt and the knobs into the page's form, as a user would."""
    values = {"prompt": PROMPT, **KNOBS}
    page.js(
        f"for (const [k, v] of Object.entries({json.dumps(values)})) {{"
        " const el = document.getElementById(k); el.value = String(v);"
        " el.dispatchEvent(new Event('input')); }"
    )


def test_the_page_streams_to_the_answer(url, tmp_path):
    full = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, **KNOBS}, timeout=60).json()
    out = Path(os.environ.get("DLMRT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    with Browser(tmp_path / "profile") as page:
        page.open(url + "/")
        page.wait("document.readyState === 'complete' && !!document.getElementById('run')")
        _fill(page)
        page.js("document.getElementById('run').click()")
        page.wait("['done', 'error'].includes(document.getElementById('output').dataset.status)")
        assert page.js("document.getElementById('error').textContent") == ""
        shown = page.js("document.getElementById('output').textContent")
        assert shown == full["choices"][0]["text"] and "29" in shown  # the demo model solves it
        stats = page.js(
            "Object.fromEntries([...document.querySelectorAll('#stats td[id]')]"
            ".map((td) => [td.id.slice(5), td.textContent]))"
        )
        assert int(stats["tokens"]) == full["usage"]["completion_tokens"]
        rounds = [int(r) for r in stats["rounds"].split(",")]
        assert len(rounds) == int(stats["blocks"]) and sum(rounds) > len(rounds)
        frames = int(page.js("document.getElementById('replay').max"))
        assert frames == sum(rounds)  # one replay frame per round
        page.js(
            "const r = document.getElementById('replay'); r.value = 1;"
            " r.dispatchEvent(new Event('input'));"
        )
        assert page.js("document.querySelectorAll('#output .M').length") > 0  # a masked guess
        page.screenshot(out / "playground.png")
    assert (out / "playground.png").stat().st_size > 10_000
