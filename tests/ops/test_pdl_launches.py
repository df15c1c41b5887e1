"""Every Triton kernel we launch takes part in programmatic dependent launch (kernels/pdl.py).

Static, from the sources (no triton needed): each `@triton.jit` function of kernels/ that is
launched (`kernel[grid](...)`) takes a `PDL: tl.constexpr` and opens with `pdl.enter(PDL)`, so
its gdc_wait comes before any global load, store or atomic; each launch passes `**pdl.launch()`
(the constexpr and Triton's `launch_pdl` together: a kernel launched with the attribute that did
not wait would race its producer). No Triton kernel is defined or launched outside kernels/.
`test_pdl_ptx.py` checks the compiled form.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
# "module.kernel": why it launches without PDL. None today: every launched kernel takes it.
EXEMPT: dict[str, str] = {}
# launched kernels the scan must find (a parser that finds none would pass vacuously)
EXPECTED = {
    "fp8_gemm._fp8_gemm_kernel", "fp8_gemm._fp8_gemm_tma_kernel", "fp8_glu_gemm._fp8_glu_gemm_kernel",
    "fp8_quant._quant_rows_kernel", "moe_mlp._gate_up_kernel", "moe_mlp_fp8._quant_groups_kernel",
    "moe_mlp_nvfp4._down_kernel", "moe_plan._chunk_scan_kernel", "moe_route._route_softmax_kernel",
    "canvas_attention._canvas_attention_kernel", "canvas_vocab_split._split_finish_kernel",
    "arena_attention_split._combine_kernel", "linear_nvfp4._linear_kernel",
    "vocab_pass._vocab_split_kernel", "arena_attention._arena_attention_kernel",
}  # fmt: skip
# the GEMM main loops: launched with `pdl.launch(gemm=True)`, so DLMRT_PDL=nogemm leaves them out
GEMMS = {
    "fp8_gemm._fp8_gemm_kernel", "fp8_gemm._fp8_gemm_tma_kernel", "fp8_glu_gemm._fp8_glu_gemm_kernel",
    "linear_nvfp4._linear_kernel", "moe_mlp._gate_up_kernel",
    "moe_mlp._down_kernel", "moe_mlp_fp8._gate_up_kernel", "moe_mlp_fp8._down_kernel",
    "moe_mlp_nvfp4._gate_up_kernel", "moe_mlp_nvfp4._down_kernel",
}  # fmt: skip


def _is_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        dec = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(dec, ast.Attribute) and dec.attr == "jit":
            return True
    return False


def _is_call(node: ast.AST, obj: str, attr: str) -> bool:
    """node is `obj.attr(...)`."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == obj
    )


def _modules(directory: Path) -> dict[str, ast.Module]:
    """'package/module' (relative to `directory`) -> its syntax tree."""
    paths = sorted(directory.rglob("*.py"))
    return {str(p.relative_to(directory).with_suffix("")): ast.parse(p.read_text()) for p in paths}


def _jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)}


def _launches(tree: ast.Module) -> list[ast.Call]:
    """Calls of the form `name[grid](...)` (a Triton launch)."""
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Subscript)
        and isinstance(n.func.value, (ast.Name, ast.Attribute))
    ]


def _launch_name(call: ast.Call) -> str:
    value = call.func.value
    return value.id if isinstance(value, ast.Name) else value.attr


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The statements after the docstring."""
    body = fn.body
    doc = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return body[1:] if doc else body


def _launched() -> dict[str, tuple[ast.FunctionDef, list[ast.Call]]]:
    """'module.kernel' -> (its definition, its launch sites), over kernels/."""
    out = {}
    for module, tree in _modules(KERNELS).items():
        jit = _jit_functions(tree)
        for call in _launches(tree):
            name = _launch_name(call)
            assert name in jit, f"kernels/{module}.py launches {name}, defined elsewhere"
            out.setdefault(f"{module}.{name}", (jit[name], []))[1].append(call)
    return out


def test_every_launched_kernel_waits_first():
    launched = _launched()
    assert EXPECTED <= set(launched), f"not found as launched: {EXPECTED - set(launched)}"
    assert set(EXEMPT) <= set(launched), f"stale exemptions: {set(EXEMPT) - set(launched)}"
    assert GEMMS <= set(launched), f"stale GEMM names: {GEMMS - set(launched)}"
    wrong = []
    for name, (fn, _) in sorted(launched.items()):
        if name in EXEMPT:
            continue
        params = {a.arg: a.annotation for a in fn.args.args}
        ann = params.get("PDL")
        if not (isinstance(ann, ast.Attribute) and ann.attr == "constexpr"):
            wrong.append(f"{name}: no `PDL: tl.constexpr` parameter")
        first = _body(fn)[0]
        enter = isinstance(first, ast.Expr) and _is_call(first.value, "pdl", "enter")
        if not (enter and [ast.unparse(a) for a in first.value.args] == ["PDL"]):
            wrong.append(f"{name}: first statement is not pdl.enter(PDL): {ast.unparse(first)}")
    assert not wrong, "\n".join(wrong)


def test_every_launch_passes_the_switch():
    wrong = []
    for name, (_, calls) in sorted(_launched().items()):
        for call in calls:
            where = f"{name} (line {call.lineno})"
            spread = [
                k for k in call.keywords if k.arg is None and _is_call(k.value, "pdl", "launch")
            ]
            if name not in EXEMPT and len(spread) != 1:
                wrong.append(f"{where}: no **pdl.launch()")
            elif spread and spread[0].value.args:
                wrong.append(f"{where}: pdl.launch takes gemm= by keyword")
            elif spread and [ast.unparse(k) for k in spread[0].value.keywords] != (
                ["gemm=True"] if name in GEMMS else []
            ):
                wrong.append(f"{where}: pdl.launch(gemm=True) is for the GEMMs ({sorted(GEMMS)})")
            named = {k.arg for k in call.keywords} & {"PDL", "launch_pdl"}
            if named:  # set apart from the switch: a kernel that waits unlaunched, or the reverse
                wrong.append(f"{where}: passes {sorted(named)} by hand")
    assert not wrong, "\n".join(wrong)


def test_pdl_enter_waits_then_triggers():
    """kernels/pdl.py's `enter`: gdc_wait, then gdc_launch_dependents, only under PDL."""
    fn = _jit_functions(_modules(KERNELS)["pdl"])["enter"]
    (branch,) = _body(fn)
    assert isinstance(branch, ast.If) and ast.unparse(branch.test) == "PDL" and not branch.orelse
    calls = [ast.unparse(s.value) for s in branch.body]
    assert calls == ["tl.extra.cuda.gdc_wait()", "tl.extra.cuda.gdc_launch_dependents()"]


def test_no_triton_kernel_outside_kernels():
    """A kernel defined or launched elsewhere would escape the checks above."""
    names = {n for tree in _modules(KERNELS).values() for n in _jit_functions(tree)}
    found = []
    for directory in ("dlmrt", "benchmarks", "csrc", "examples", "recipes"):
        if not (ROOT / directory).is_dir():
            continue
        for module, tree in _modules(ROOT / directory).items():
            found += [f"{directory}/{module}: jit {n}" for n in _jit_functions(tree)]
            found += [
                f"{directory}/{module}: launches {_launch_name(c)}"
                for c in _launches(tree)
                if _launch_name(c) in names
            ]
    assert not found, found
