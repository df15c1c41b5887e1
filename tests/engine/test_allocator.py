"""The engine switches the CUDA allocator to expandable segments once, unless the user chose."""

import pytest
import torch

from dlmrt.engine import allocator


@pytest.fixture
def calls(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(allocator, "_setter", lambda: seen.append)
    monkeypatch.setattr(allocator, "_done", False)
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return seen


def test_cuda_switches_once(calls):
    assert allocator.use_expandable_segments(torch.device("cuda"))
    assert allocator.use_expandable_segments("cuda:0")
    assert calls == ["expandable_segments:True"]


@pytest.mark.parametrize("name", allocator.USER_SETTINGS)
def test_cpu_and_a_user_setting_are_left_alone(calls, monkeypatch, name):
    assert not allocator.use_expandable_segments(torch.device("cpu"))
    monkeypatch.setenv(name, "expandable_segments:False")
    assert not allocator.use_expandable_segments(torch.device("cuda"))
    assert calls == []


def test_a_refusing_torch_is_logged_not_fatal(monkeypatch, caplog):
    def refuse(settings: str) -> None:
        raise RuntimeError("unsupported")

    monkeypatch.setattr(allocator, "_setter", lambda: refuse)
    monkeypatch.setattr(allocator, "_done", False)
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level("INFO", logger="dlmrt"):
        assert not allocator.use_expandable_segments("cuda")
    assert "unsupported" in caplog.text


def test_this_torch_has_a_setter():
    assert callable(allocator._setter())


def test_a_cpu_engine_does_not_touch_the_allocator(calls):
    from dlmrt.engine.graph.workspace import Workspace

    Workspace("eager", lambda rows: None, torch.device("cpu"))
    assert calls == []
