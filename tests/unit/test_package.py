"""The package's face and its layering: `psrv.__all__` is exactly what psrv's docstring lists, each
name resolves, `import psrv` stays light, and only psrv/transport imports zmq or torch RPC."""
import ast
import subprocess
import sys
from pathlib import Path

import psrv
from tests.helpers import ROOT

TRANSPORT_ONLY = ("zmq", "torch.distributed.rpc")


def _listed_in_docstring() -> list[str]:
    """The first word of each indented line of psrv's docstring: its table of public names."""
    return [line.split()[0] for line in psrv.__doc__.splitlines() if line.startswith("    ") and line.strip()]


def test_all_is_exactly_what_the_docstring_lists_and_every_name_resolves():
    assert _listed_in_docstring() == list(psrv.__all__)
    for name in psrv.__all__:
        assert getattr(psrv, name) is not None, name


def test_import_psrv_does_not_import_torch():
    code = "import sys, psrv; assert psrv.__version__; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _uses(names: set[str], banned: str) -> bool:
    return any(n == banned or n.startswith(banned + ".") for n in names)


def test_only_the_transport_package_imports_zmq_or_torch_rpc():
    offenders = []
    for top in ("psrv", "workers"):
        for path in sorted((Path(ROOT) / top).rglob("*.py")):
            if path.is_relative_to(Path(ROOT) / "psrv" / "transport"):
                continue
            names = _imports(path)
            offenders += [f"{path.relative_to(ROOT)}: {b}" for b in TRANSPORT_ONLY if _uses(names, b)]
    assert offenders == []


def test_the_transport_interface_imports_no_implementation():
    names = _imports(Path(ROOT) / "psrv" / "transport" / "base.py")
    assert not any(_uses(names, f"psrv.transport.{m}") for m in ("zmq", "torch_rpc", "rpc_world", "curve"))
    assert not _uses(names, "zmq") and not _uses(names, "torch")
