"""The `mode` fixture of the sandbox tests: each test once per isolation mode (the namespaces,
skipped where `unshare` does not work here, and the audit-hook fallback)."""

from __future__ import annotations

import pytest

from dlmrt.bench import sandbox


@pytest.fixture(name="mode", params=["namespaces", "fallback"])
def isolation_mode(request, monkeypatch) -> sandbox.Mode:
    chosen = sandbox.NAMESPACES if request.param == "namespaces" else sandbox.FALLBACK
    if chosen is sandbox.NAMESPACES and sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("user/mount/network/PID namespaces are not available here")
    monkeypatch.setattr(sandbox, "isolation", lambda: chosen)
    return chosen
