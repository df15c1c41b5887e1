"""`dlmrt generate --watch` (`dlmrt/watch.py`): plain lines on stderr and the text alone on stdout
when stdout is not a terminal; ANSI redraws on a terminal (a pseudo-terminal here), ending with the
final text and the stats."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlmrt.cli import main
from dlmrt.drafts import Draft
from dlmrt.watch import Watch

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Tom has 23 apples. He buys 15 more and gives away 9. How many apples now?"
KNOBS = ["--rule", "threshold", "--threshold", "0.999", "--max-new-tokens", "48"]
LINE = re.compile(r"\[block (\d+) round (\d+)\] '(.*)'")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_watch_without_a_terminal(capsys):
    """stdout: the final text only (as without --watch); stderr: one line per round, masked rows
    as `_`, the last line of each block its text, then the stats."""
    assert main(["generate", PROMPT, *KNOBS]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", "--watch", PROMPT, *KNOBS]) == 0
    out, err = capsys.readouterr()
    assert out == plain and "29" in out
    lines = [LINE.fullmatch(x) for x in err.splitlines() if x.startswith("[block ")]
    assert all(lines) and len(lines) > len({m.group(1) for m in lines})  # a block took 2+ rounds
    assert any("_" in m.group(3) for m in lines)  # a masked row was shown
    last = {}
    for m in lines:
        last[m.group(1)] = m.group(3)
    assert "".join(last.values()) == out.removesuffix("\n")
    assert "TPF" in err.splitlines()[-1]


def test_watch_on_a_terminal():
    """A pseudo-terminal: styled frames redrawn in place, then the final text and the stats."""
    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "dlmrt", "generate", "--watch", "--watch-delay", "0", PROMPT]
    proc = subprocess.Popen([*cmd, *KNOBS], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    screen = b"".join(chunks).decode()
    assert "\x1b[2m" in screen and "\x1b[1;32m" in screen  # masked rows dimmed, accepted bold
    assert screen.count("\x1b[J") >= 2  # redrawn in place
    tail = screen.rsplit("\x1b[J", 1)[1]  # after the last redraw: the final text, then the stats
    text, stats = tail.strip("\r\n").split("\r\n")[:2]
    assert "29" in text and "\x1b[" not in text and "TPF" in stats


def test_redraw_clears_exactly_the_rows_it_drew(monkeypatch):
    """A wrapped line counts as several terminal rows: the next frame moves up by all of them."""
    monkeypatch.setenv("COLUMNS", "100")  # shutil.get_terminal_size reads it first
    out = io.StringIO()
    view = Watch(lambda ids: "x" * len(ids), out, io.StringIO(), tty=True, delay=0)
    view._redraw("a" * 450 + "\nstatus", "a" * 450 + "\nstatus")  # 5 rows + 1
    view.show(Draft(0, 1, (), (1, 2), "AM", (0.5, 0.5)))
    assert out.getvalue().count("\x1b[6F\x1b[J") == 1


def test_watch_delay_must_not_be_negative(capsys):
    assert main(["generate", "--watch", "--watch-delay", "-1", PROMPT]) == 2
    assert "--watch-delay" in capsys.readouterr().err
