"""An update rule that corrects a push for its staleness (staleness-lr, dc-asgd, dc-asgd-a) would be plain
under sync, whose clocks step on a mean at staleness 0: the config tree refuses the pair in one line naming
both settings, wherever a config comes from (the command line, a spec, a process's JSON, a ServerConfig).
dn stays, as sync's SGD-Nesterov. The all-reduce modes have no shards, so every rule but plain is refused
there (it was taken and ignored, while the report named it)."""
from __future__ import annotations

import json

import pytest

from psrv.cli.main import main
from psrv.config import ConfigError, OptimConfig, RunConfig, ServerConfig, from_dict, to_dict
from psrv.config.optimizer import NESTEROV_RULES, STALENESS_RULES, UPDATE_RULES
from psrv.config.sections import ALLREDUCE_MODES
from psrv.experiments.harness.spec import spec_from_dict


@pytest.mark.parametrize("rule", STALENESS_RULES)
def test_sync_refuses_a_staleness_rule_in_one_line_naming_both_settings(rule):
    optimizer = {"update_rule": rule, **({"nesterov": True} if rule in NESTEROV_RULES else {})}
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"mode": "sync", "optimizer": optimizer})
    text = str(err.value)
    assert text.startswith(f"optimizer.update_rule: {rule!r}") and "mode 'sync'" in text and "\n" not in text
    with pytest.raises(ConfigError, match="optimizer.update_rule.*mode 'sync'"):
        ServerConfig(mode="sync", workers=2, optimizer=OptimConfig(**optimizer))


@pytest.mark.parametrize("rule", ["staleness-lr", "cgad"])
def test_under_a_quorum_the_refusal_says_the_merge_hides_each_pushs_age(rule):
    """A quorum merge's pushes have ages (most a merge old), so the line must not say sync has none: it says
    the rule would see only the merge's mean."""
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"mode": "sync", "cluster": {"workers": 4}, "quorum": 3,
                              "optimizer": {"update_rule": rule}})
    text = str(err.value)
    assert text.startswith(f"optimizer.update_rule: {rule!r}") and "quorum merge" in text and "\n" not in text
    assert "does not have" not in text
    with pytest.raises(ConfigError, match="quorum merge"):
        ServerConfig(mode="sync", workers=4, quorum=3, optimizer=OptimConfig(update_rule=rule))


def test_every_other_pair_of_mode_and_rule_is_taken():
    for mode in ("sync", "async", "ssp"):
        for rule in UPDATE_RULES:
            if mode == "sync" and rule in STALENESS_RULES:
                continue
            optimizer = {"update_rule": rule, **({"nesterov": True} if rule in NESTEROV_RULES else {})}
            cfg = from_dict(RunConfig, {"mode": mode, "optimizer": optimizer})
            assert cfg.optimizer.update_rule == rule
            assert from_dict(RunConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg  # a process's JSON
    assert set(STALENESS_RULES) < set(UPDATE_RULES) and {"plain", "dn"}.isdisjoint(STALENESS_RULES)


def test_the_command_line_says_it_in_one_line_and_exits_2(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--mode", "sync", "--update-rule", "dc-asgd", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("psrv run: error: --update-rule: 'dc-asgd'"), err
    assert "mode 'sync'" in err and not out.exists()


def test_a_spec_variant_is_refused_by_its_index():
    spec = {"name": "t", "target": {"eval_loss": 1.0}, "variants": [
        {"name": "ok", "mode": "async", "optimizer": {"update_rule": "dc-asgd"}},
        {"name": "bad", "mode": "sync", "optimizer": {"update_rule": "staleness-lr"}}]}
    with pytest.raises(ConfigError, match=r"variants\[1\].*update_rule.*mode 'sync'"):
        spec_from_dict(spec)


@pytest.mark.parametrize("mode", ALLREDUCE_MODES)
def test_an_allreduce_mode_refuses_every_rule_but_plain(mode):
    assert from_dict(RunConfig, {"mode": mode, "optimizer": {"update_rule": "plain"}}).mode == mode
    for rule in UPDATE_RULES:
        if rule == "plain":
            continue
        optimizer = {"update_rule": rule, **({"nesterov": True} if rule in NESTEROV_RULES else {})}
        with pytest.raises(ConfigError) as err:
            from_dict(RunConfig, {"mode": mode, "optimizer": optimizer})
        assert str(err.value).startswith("optimizer.update_rule: is how a shard treats a push; "
                                         f"mode {mode!r} has no shards"), err.value
