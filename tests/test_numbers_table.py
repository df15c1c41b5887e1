"""docs/numbers.md's round table is what benchmarks/numbers_table.py makes of the result files
(regenerate: `python -m benchmarks.numbers_table --write docs/numbers.md`)."""

from __future__ import annotations

from pathlib import Path

from benchmark_modules import benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_the_doc_holds_the_current_table():
    nt = benchmark("numbers_table")
    doc = (ROOT / "docs" / "numbers.md").read_text()
    inside = doc.split(nt.BEGIN, 1)[1].split(nt.END, 1)[0].strip()
    assert inside == nt.table(str(ROOT / "benchmarks" / "results"))
    for line in inside.splitlines()[2:]:  # every cited file exists
        assert (ROOT / "benchmarks" / "results" / line.rsplit("`", 2)[1]).is_file()


def test_the_newest_run_of_a_configuration_wins(tmp_path):
    """The newest run, not the fastest nor the last file by name; experiment files left out."""
    import json

    nt = benchmark("numbers_table")
    runs = (
        ("z_old_fast", "2026-01-01", 3.0),
        ("a_new_slow", "2026-02-01", 4.0),
        ("split_on_c", "2026-03-01", 1.0),
    )
    for name, date, ms in runs:
        (tmp_path / f"round_latency_{name}.json").write_text(
            json.dumps(
                {
                    "model": "qwen_dlm",
                    "date": date,
                    "git_revision": name,
                    "command": "x --quantization=fp8",
                    "shape": {"dtype": {"weights": "bf16"}},
                    "results": [
                        {
                            "mode": "block_graph",
                            "context": 1024,
                            "ms_per_round": ms,
                            "floor_ms": 3.0,
                            "fp8_floor_ms": 2.0,
                        }
                    ],
                }
            )
        )
    rows = nt.table(str(tmp_path)).splitlines()[2:]
    assert len(rows) == 1
    assert "| fp8 |" in rows[0] and "| 4.000 | 2.00 | 2.00 | a_new_slow, 2026-02-01 |" in rows[0]
    assert (
        nt.requested("x --quantization") is None and nt.requested("--quantization none") == "bf16"
    )
