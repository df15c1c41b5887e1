"""The package's import structure: no cycles, and the layers point one way.

Every `import` / `from ... import` of a `dlmrt` module counts, also those inside functions (a lazy
import is still a dependency; it only defers the cycle to run time). Parent packages a module
imports implicitly (`dlmrt`, `dlmrt.engine`) are not edges: only what the source names is.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / package).rglob("*.py")}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` (a module or module.attribute) refers to."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:` (annotations only, never imported)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in ast.walk(child))
            continue
        yield node
        yield from _runtime_nodes(node)


def import_graph(package: str = "dlmrt") -> dict[str, set[str]]:
    """module -> the package's modules it imports (absolute and relative imports)."""
    known = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            for n in names:
                target = _resolve(n, known)
                if target is not None and target != mod:
                    graph[mod].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def _edges_into(graph, source_prefix: str, target_prefixes: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if m == source_prefix or m.startswith(source_prefix + ".")
        for t in targets
        if any(t == p or t.startswith(p + ".") for p in target_prefixes)
    )


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_inside_dlmrt():
    assert find_cycle(import_graph()) is None


def test_layers_point_one_way():
    g = import_graph()
    assert _edges_into(g, "dlmrt.decoding", ("dlmrt.engine", "dlmrt.models")) == []
    upper = ("dlmrt.llm", "dlmrt.cli", "dlmrt.server", "dlmrt.bench", "dlmrt.train")
    assert _edges_into(g, "dlmrt.engine", upper) == []
    assert _edges_into(g, "dlmrt.models", ("dlmrt.engine",) + upper) == []
    assert _edges_into(g, "dlmrt.reference", ("dlmrt.engine",) + upper) == []


def folder_pairs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Pairs of top-level units of the package (a folder or a root module) that import each
    other, module-level cycles aside (`dlmrt.a.x -> dlmrt.b.y` and `dlmrt.b.z -> dlmrt.a.w`)."""
    unit = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    edges = {(unit(m), unit(t)) for m, ts in graph.items() for t in ts if unit(m) != unit(t)}
    return {tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges}


def test_no_pair_of_folders_imports_each_other():
    assert folder_pairs({"a.x.p": {"a.y.q"}, "a.y.r": {"a.x.s"}, "a.z": {"a.x.p"}}) == {
        ("a.x", "a.y")
    }
    assert folder_pairs(import_graph()) == set()


def test_weight_formats_are_the_bottom_layer():
    """dlmrt/formats/ (FP8, NVFP4 containers) imports nothing of dlmrt but itself, so ops, models
    and the checkpoint code can all read it."""
    g = import_graph()
    outside = [
        f"{m} -> {t}"
        for m, ts in g.items()
        if m.startswith("dlmrt.formats")
        for t in ts
        if not t.startswith("dlmrt.formats")
    ]
    assert outside == []
    assert _edges_into(g, "dlmrt.ops", ("dlmrt.quant", "dlmrt.loading")) == []
    assert _edges_into(g, "dlmrt.models", ("dlmrt.quant", "dlmrt.loading")) == []
    assert _edges_into(g, "dlmrt.loading", ("dlmrt.quant",)) == []  # writing sits above reading


FILE_IO_MODULES = {"json", "io", "os", "shutil", "pickle", "safetensors", "tempfile"}
# `read_json`: dlmrt/json_file.py's checkpoint-file reader
FILE_IO_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "load", "save"}
FILE_IO_CALLS.add("read_json")


def file_io(path: Path) -> list[str]:
    """The file I/O a module's source names: an I/O module imported, or a call of `open`, a
    path's read/write methods, `torch.load` / `torch.save` (a `Path` in an annotation is none)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            found += [f"import {n}" for n in names if (n or "").split(".")[0] in FILE_IO_MODULES]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in FILE_IO_CALLS:
                found.append(f"{name}() at line {node.lineno}")
    return found


def test_the_decoding_layer_does_no_file_io():
    """Rules and canvas settings take what the loader parsed (`Setup.checkpoint`), never a path
    to read."""
    assert file_io(ROOT / "dlmrt/json_file.py")  # the check sees a module that reads a file
    decoding = sorted((ROOT / "dlmrt/decoding").rglob("*.py"))
    assert decoding  # the check ran over real files
    assert {str(p.relative_to(ROOT)): io for p in decoding if (io := file_io(p))} == {}


def test_parallel_primitives_sit_below_what_shards_and_launches():
    """Models and engines use dlmrt/parallel/ (the group, vocab-parallel statistics); only the
    front (llm.py, the spawned rank's entry) uses dlmrt/distributed/ (sharding, ranks, requests)."""
    g = import_graph()
    below = ("dlmrt.models", "dlmrt.engine", "dlmrt.decoding", "dlmrt.ops", "dlmrt.parallel")
    for name in below:
        assert _edges_into(g, name, ("dlmrt.distributed",)) == []
    assert _edges_into(g, "dlmrt.parallel", ("dlmrt.models", "dlmrt.engine", "dlmrt.llm")) == []


def test_tasks_serve_training_and_the_quantize_tool_from_below():
    """dlmrt/tasks/ (procedural, verifiable tasks) imports no front end; the quantize tool's
    calibration reads tasks without importing the trainer."""
    g = import_graph()
    fronts = ("dlmrt.train", "dlmrt.bench", "dlmrt.server", "dlmrt.llm", "dlmrt.quant")
    assert _edges_into(g, "dlmrt.tasks", fronts) == []
    assert _edges_into(g, "dlmrt.quant", ("dlmrt.train",)) == []


def test_kernels_import_nothing_from_dlmrt():
    kernels = import_graph("kernels")
    assert kernels  # the graph was built over real files
    for path in (ROOT / "kernels").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "dlmrt" for a in node.names), path
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "dlmrt", path


def _oversized(roots: tuple[str, ...]) -> list[str]:
    found = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            src = path.read_text()
            if src.count("\n") > 300:
                found.append(f"{path.relative_to(ROOT)}: {src.count(chr(10))} lines")
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 60:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines}")
    return found


def test_files_and_functions_stay_small():
    """House style: no file over 300 lines, no function over 60 (package, kernels, benchmarks)."""
    assert _oversized(("dlmrt", "kernels", "benchmarks")) == []


def test_model_forwards_never_branch_on_quantization():
    """How a layer runs is its implementation object's business (dlmrt/impls): no forward in
    dlmrt/models names a format or a kernel plan, models/ holds no install code, and the
    implementations never import the models (they see modules by their slots)."""
    words = ("fp8", "nvfp4", "plan", "quant")
    found = []
    for path in sorted((ROOT / "dlmrt" / "models").rglob("*.py")):
        assert "install" not in path.name, path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in ("forward", "__call__"):
                src = ast.get_source_segment(path.read_text(), node).lower()
                found += [f"{path.name}:{node.lineno} {w}" for w in words if w in src]
    assert found == []
    g = import_graph()
    assert _edges_into(g, "dlmrt.impls", ("dlmrt.models", "dlmrt.loading", "dlmrt.engine")) == []
