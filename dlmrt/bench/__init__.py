"""`dlmrt bench`: accuracy, tokens per forward and tokens/s on a dataset (paper, Appendix E.1).

datasets.py (JSONL / HumanEval problems and their prompts), scorers.py (numeric answers),
humaneval_runner.py (sandboxed test execution; the sandbox: sandbox.py on the host side,
sandbox_wrapper.py inside), report.py (metrics, table, JSON), plot.py (the accuracy-vs-throughput
frontier), runner.py (the subcommand). Nothing heavy is imported here.
"""


class MissingDependency(RuntimeError):
    """An optional package that this feature needs is not installed (the message says which)."""
