"""Only psrv/transport imports torch RPC. import-linter sees an external package by its top-level name
(`torch`) only, so this reads every module of psrv, as it installs (workers/ and experiments/ included),
for imports of torch.distributed.rpc. The one module outside it that may is a baseline psrv is measured against, not
part of psrv: pytorch/examples' RPC parameter server, as the peers bench runs it (experiments/peers/rpc_ps.py), as
the zmq contract lets the bench's raw echo import zmq."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("psrv", "workers", "experiments")
BASELINES = {"experiments/peers/rpc_ps.py"}  # a peer's own program, written with torch RPC


def rpc_imports(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        if any(n == "torch.distributed.rpc" or n.startswith("torch.distributed.rpc.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_transport_imports_torch_rpc():
    found = {str(p.relative_to(ROOT)): rpc_imports(p) for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}
    found = {path: lines for path, lines in found.items() if lines}
    assert found, "no module imports torch RPC at all: this test would check nothing"
    outside = {path: lines for path, lines in found.items()
               if not path.startswith("psrv/transport/") and path not in BASELINES}
    assert BASELINES <= set(found), "a baseline listed here no longer imports torch RPC: take it off the list"
    assert not outside, f"torch RPC imported outside psrv/transport: {outside}"


def test_the_check_sees_each_form_of_the_import(tmp_path):
    forms = ["import torch.distributed.rpc as rpc", "from torch.distributed import rpc",
             "from torch.distributed.rpc import RRef", "def f():\n    import torch.distributed.rpc"]
    for i, form in enumerate(forms):
        (tmp_path / f"m{i}.py").write_text(form + "\n")
        assert rpc_imports(tmp_path / f"m{i}.py"), form
    (tmp_path / "clean.py").write_text("import torch.distributed as dist\nfrom torch import nn\n")
    assert not rpc_imports(tmp_path / "clean.py")
