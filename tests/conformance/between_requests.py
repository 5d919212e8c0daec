"""A pytest plugin that checks, before every request a shard in the test process handles, what grace.py's `take`
relies on: between requests no merge or barrier is ready to commit and every quorum merge with its Q workers has
a grace window, so a `commit_if_ready()` there changes nothing. It wraps psrv/server/pushes/handler.py
`Pushes.end_grace`: where no window is due, it calls `commit_if_ready()` anyway and compares the shard's version,
its controller's open clock and its windows before and after; a change fails the shard's request (and so its
test). The counts go to stdout at the end. Not run by `make test`; the evidence for the equivalent mutant
`take`'s `return True` (tests/conformance/equivalent_mutants.toml):

    .venv/bin/python -m pytest -q -p tests.conformance.between_requests tests/conformance \\
        --ignore=tests/conformance/test_rpc_matrix.py --ignore=tests/conformance/test_rpc_matrix_odd.py

(the torch RPC cases' shards are processes of their own, which the wrapper does not reach)."""
from __future__ import annotations

from psrv.server.pushes import handler

COUNTS = {"requests": 0, "checked": 0, "changed": 0}
_end_grace = handler.Pushes.end_grace


def _seen(pushes) -> tuple | None:
    s = pushes.state
    if s.shard is None:
        return None
    return s.shard.version, getattr(s.controller, "open_clock", None), dict(pushes.grace.until)


def end_grace(self, judged: dict | None) -> None:
    COUNTS["requests"] += 1
    if self.grace.take(judged):
        self.commit_if_ready()
        return
    before = _seen(self)
    if before is None:
        return
    COUNTS["checked"] += 1
    self.commit_if_ready()
    after = _seen(self)
    if after != before:
        COUNTS["changed"] += 1
        raise AssertionError(f"a commit_if_ready() between requests changed the shard: {before} -> {after}")


def pytest_configure(config) -> None:
    handler.Pushes.end_grace = end_grace


def pytest_unconfigure(config) -> None:
    handler.Pushes.end_grace = _end_grace


def pytest_terminal_summary(terminalreporter) -> None:
    c = COUNTS
    terminalreporter.write_line(f"between requests: {c['requests']} requests, {c['checked']} checked with a shard, "
                                f"{c['changed']} changed by a commit_if_ready()")
