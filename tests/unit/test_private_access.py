"""No module of psrv (psrv/, workers/ and experiments/) reads a private attribute of another object: every
`x._name` (one leading underscore, not a dunder) has `self` or `cls` as its x. A class that works with
another (RoundTrip with PSClient, ChunkedPushes with ShardService) uses its public face, so either can
change its insides alone. The few exceptions are listed in ALLOWED, each with its reason; an entry that no
longer occurs fails too, so the list stays as short as the code needs."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("psrv", "workers", "experiments")

# (file, the access as ast.unparse writes it): why it may read that private attribute
ALLOWED = {
    ("psrv/transport/torch_rpc.py", "endpoint._arrive"):
        "torch RPC calls a module function, _serve_request, which hands the request to the RpcServer of the "
        "same module",
    ("workers/allreduce/__main__.py", "os._exit"):
        "the standard library's exit without cleanup, public despite its underscore",
    ("psrv/cli/zygote.py", "os._exit"):
        "the standard library's exit without cleanup, public despite its underscore",
    ("experiments/bench/colocated.py", "client.net._plane"):
        "the benchmark reports which payload plane the zmq transport chose; no public member says so",
}


def private_reads(path: Path) -> set[str]:
    """Every `x._name` in `path` whose x is not the name self or cls, as ast.unparse writes it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.add(ast.unparse(node))
    return found


def scan() -> set[tuple[str, str]]:
    return {(path.relative_to(ROOT).as_posix(), access)
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
            for access in private_reads(path)}


def test_no_module_reads_another_objects_private_attributes():
    found = scan()
    unexplained = sorted(found - ALLOWED.keys())
    assert not unexplained, ("private attributes read from outside their object; give the class a public "
                             f"member for it (or, with a reason, list it in ALLOWED): {unexplained}")
    stale = sorted(ALLOWED.keys() - found)
    assert not stale, f"ALLOWED lists accesses that no longer occur; remove them: {stale}"


def test_the_scan_sees_a_private_read_and_lets_self_and_cls_be(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("class A:\n    def f(self, other):\n        return self._a, cls._b, other._c, other.d._e, "
                      "other.__class__, f()._g\n")
    assert private_reads(source) == {"other._c", "other.d._e", "f()._g"}
