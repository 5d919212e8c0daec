"""Server-side update rules: how a push's gradient is scaled or corrected before the optimizer step.

A rule is one small class registered by name (`@register`); `make_rule(cfg, size, device)` builds the
one `OptimConfig.update_rule` names. The names must match psrv/config/optimizer.py's UPDATE_RULES
(the config tree imports no torch, so it keeps its own list; tests/unit/test_update_rules.py checks).
Formulas and sources: docs/algorithms.md.
"""
from __future__ import annotations

from psrv.server.rules.base import RULES, PushContext, UpdateRule, make_rule, register
from psrv.server.rules import cgad, dc, dn, heloco, staleness  # noqa: F401  (they register themselves)

__all__ = ["RULES", "PushContext", "UpdateRule", "make_rule", "register"]
