"""prefer="memory" on an NVFP4 checkpoint, installed as on CUDA (`has_quantized_kernels` faked, the
CPU twins run the kernels): the experts run as `Nvfp4Experts` and the dense MLPs as `Nvfp4Linear`s
whatever the speed choices say, their model-dtype parameters are never allocated (on meta until
the install, empty after; no NVFP4 weight is dequantized while loading), and the tokens are
those of the W4A16 path installed the old way (the allocated, dequantized model, then
`use_quantized`). Also: the deferred weights' finite check, a bf16 checkpoint, the option's check."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from nvfp4_helpers import nvfp4_sources
from safetensors.torch import load_file, save_file

from dlmrt import LLM
from dlmrt.config import EngineConfig
from dlmrt.errors import CheckpointError
from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.impls import dense_install, expert_install
from dlmrt.impls.experts import Nvfp4Experts
from dlmrt.impls.nvfp4_linear import Nvfp4Linear
from dlmrt.loading import checkpoint, placement
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.loading.deferred import materialize
from dlmrt.models.layers import SwiGLU
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

CPU = torch.device("cpu")
PROMPT, KW = [11, 6, 27, 8, 9], dict(max_new_tokens=8, ignore_eos=True)
EXPERT_LAYERS = {"qwen": 0, "llada2": 2, "dg": 5}  # MoE layers of the tiny models
DENSE_MLPS = {"qwen": 2, "llada2": 1, "dg": 5}  # all-NVFP4 dense MLPs


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return nvfp4_sources(tmp_path_factory.mktemp("nvfp4memsrc"))


@pytest.fixture(scope="module")
def ckpts(sources, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nvfp4mem")
    return {f: write_nvfp4_checkpoint(src, root / f) for f, src in sources.items()}


@pytest.fixture
def as_on_cuda(monkeypatch):
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)


def _spy_load(monkeypatch) -> dict:
    """Record, while loading, each NVFP4 candidate parameter's device just before the install and
    every dequantization of an NVFP4 weight (the CPU's own path dequantizes each as it is read)."""
    seen: dict = {"devices": {}, "dequantized": []}
    place, dequantize = checkpoint.place_quantized, Nvfp4Weight.dequantize

    def place_spy(model, fp8, *args):
        quantized = {n for n in fp8 if isinstance(fp8[n], Nvfp4Weight)}
        params = dict(model.named_parameters())
        seen["devices"] = {n: params[n].device.type for n in quantized if n in params}
        monkeypatch.setattr(Nvfp4Weight, "dequantize", dequantize)  # the install may dequantize
        return place(model, fp8, *args)

    def dequantize_spy(self, dtype):
        seen["dequantized"].append(tuple(self.shape))
        return dequantize(self, dtype)

    monkeypatch.setattr(checkpoint, "place_quantized", place_spy)
    monkeypatch.setattr(Nvfp4Weight, "dequantize", dequantize_spy)
    return seen


@pytest.mark.parametrize("family", ["qwen", "llada2", "dg"])
def test_memory_keeps_nvfp4_4bit_never_allocated_with_the_old_w4a16_tokens(
    ckpts, monkeypatch, as_on_cuda, family
):
    monkeypatch.setattr(expert_install, "_as_fp8", lambda *a: pytest.fail("FP8 considered"))
    monkeypatch.setattr(dense_install, "use_nvfp4_dense", lambda *a: pytest.fail("measured"))
    seen = _spy_load(monkeypatch)
    memory = LLM(ckpts[family], device="cpu", dtype="float32", mode="eager", prefer="memory")
    monkeypatch.undo()  # the old way, below, measures and dequantizes as it always did
    assert seen["devices"] and set(seen["devices"].values()) == {"meta"}
    assert seen["dequantized"] == []  # not one NVFP4 weight dequantized on the way in
    model = memory.model
    experts = [m for m in model.modules() if isinstance(getattr(m, "impl", None), Nvfp4Experts)]
    assert len(experts) == EXPERT_LAYERS[family]
    assert sum(isinstance(m, Nvfp4Linear) for m in model.modules()) == 2 * DENSE_MLPS[family]
    params = dict(model.named_parameters())  # an installed down projection is a module now
    left = [params[n] for n in seen["devices"] if n in params]
    assert len(left) >= len(experts) * 2  # every expert stack, at least
    assert all(p.numel() == 0 and p.device == CPU for p in left)  # no storage held
    assert not any(p.is_meta for p in model.parameters())

    old = LLM(ckpts[family], device="cpu", dtype="float32", mode="eager")  # allocated, dequantized
    assert not old.model.use_quantized(
        dict(load_checkpoint(ckpts[family], torch.float32, CPU).quantized)
    )
    kw = KW | ({"rng": "counter"} if family == "dg" else {})
    got = memory.generate(PROMPT, **kw).token_ids
    assert got == old.generate(PROMPT, **kw).token_ids


def test_speed_declining_a_dense_mlp_allocates_and_refuses_it(ckpts, monkeypatch, as_on_cuda):
    """The default (speed) defers the NVFP4 weights too; a dense MLP measured slower on the kernel
    is then allocated, filled dequantized and fused again: the plain model's tokens."""
    monkeypatch.setattr(dense_install, "use_nvfp4_dense", lambda *a: (False, "bf16 faster"))
    speed = LLM(ckpts["dg"], device="cpu", dtype="float32", mode="eager")
    assert not any(isinstance(m, Nvfp4Linear) for m in speed.model.modules())
    mlp = speed.model.model.layers[0].mlp
    assert mlp.gate_proj.weight.numel() > 0 and not mlp.gate_up.weight.is_meta
    assert mlp.gate_proj.weight.data_ptr() == mlp.gate_up.weight.data_ptr()  # one fused GEMM
    monkeypatch.undo()
    plain = LLM(ckpts["dg"], device="cpu", dtype="float32", mode="eager")
    kw = KW | {"rng": "counter"}
    assert speed.generate(PROMPT, **kw).token_ids == plain.generate(PROMPT, **kw).token_ids


def test_a_nan_block_scale_of_a_deferred_weight_is_named(ckpts, tmp_path, as_on_cuda):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ckpts["dg"].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bad / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("layers.1.experts.down_proj_scale"))
    scale = tensors[name].view(torch.uint8).clone()
    scale[0, 0, 0] = 0x7F  # e4m3 NaN
    tensors[name] = scale.view(torch.float8_e4m3fn)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match=name.removesuffix("_scale") + "' has non-finite"):
        load_checkpoint(bad, torch.float32, CPU, prefer="memory")


def test_a_bf16_checkpoint_loads_the_same_with_memory(sources, as_on_cuda):
    speed = load_checkpoint(sources["dg"], torch.float32, CPU).model.state_dict()
    memory = load_checkpoint(sources["dg"], torch.float32, CPU, prefer="memory")
    assert not memory.quantized
    got = memory.model.state_dict()
    assert got.keys() == speed.keys() and all(torch.equal(got[n], speed[n]) for n in got)


def test_a_bad_preference_is_named(ckpts):
    with pytest.raises(ValueError, match="prefer: expected one of speed, memory, got 'small'"):
        EngineConfig(prefer="small")
    with pytest.raises(ValueError, match="prefer: expected one of speed, memory, got 'small'"):
        load_checkpoint(ckpts["qwen"], torch.float32, CPU, prefer="small")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["llada2", "dg"])
def test_on_cuda_memory_gives_the_pinned_w4a16_tokens_and_holds_no_bf16_stacks(
    ckpts, monkeypatch, family
):
    """CUDA, bf16: prefer="memory" against the speed path pinned to W4A16 (DLMRT_NVFP4_EXPERTS,
    DLMRT_NVFP4_DENSE): the same kernels, so the same tokens; the expert parameters hold no
    storage (the full-size peak: benchmarks/rounds/nvfp4_memory.py)."""
    memory = LLM(ckpts[family], device="cuda", mode="eager", prefer="memory")
    experts = [
        m for m in memory.model.modules() if isinstance(getattr(m, "impl", None), Nvfp4Experts)
    ]
    assert experts and all(m.impl.stacks[2].packed.is_cuda for m in experts)
    assert all(p.numel() == 0 and p.is_cuda for m in experts for p in m.parameters())
    monkeypatch.setenv("DLMRT_NVFP4_EXPERTS", "w4a16")
    monkeypatch.setenv("DLMRT_NVFP4_DENSE", "kernel")
    pinned = LLM(ckpts[family], device="cuda", mode="eager")
    kw = KW | ({"rng": "counter"} if family == "dg" else {})
    assert memory.generate(PROMPT, **kw).token_ids == pinned.generate(PROMPT, **kw).token_ids


def test_a_stack_with_one_unquantized_expert_is_named(ckpts, tmp_path, as_on_cuda):
    """One bf16 expert among NVFP4 ones: the stack is not deferred, and the load names it (all
    or none of a stack's experts are NVFP4) instead of failing on the bf16 tensor."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ckpts["llada2"].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bad / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("experts.0.down_proj.weight"))
    rows, half = tensors[name].shape
    tensors[name] = torch.randn(rows, 2 * half)
    del tensors[name + "_scale"], tensors[name + "_scale_2"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(
        CheckpointError,
        match=r"experts\.down_proj: \d+ of its \d+ stored experts are NVFP4; all or none",
    ):
        load_checkpoint(bad, torch.float32, CPU, prefer="memory")


def test_materialize_holds_no_unfused_weight_while_re_fusing(monkeypatch):
    """The values handed in are let go before the re-fuse: a gate/up weight copied into the
    fused stack is freed then, not held twice until the install returns."""
    with torch.device("meta"):
        model = torch.nn.Sequential(SwiGLU(16, 32))
    model[0].fuse()  # stacked over the meta weights, as `fuse_projections` does
    values = {f"0.{p}.weight": torch.randn(32, 16) for p in ("gate_proj", "up_proj")}
    alive = [weakref.ref(v) for v in values.values()]
    held = []
    fuse = SwiGLU.fuse
    monkeypatch.setattr(SwiGLU, "fuse", lambda mlp: (held.append(len(values)), fuse(mlp)))
    materialize(model, values)
    assert held == [0] and values == {}
    assert all(ref() is None for ref in alive)  # freed: the fused stack holds their copies
    assert not model[0].gate_up.weight.is_meta
