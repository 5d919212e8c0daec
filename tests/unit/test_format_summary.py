"""The terminal summary shows the metrics the job reports, and no accuracy line for a job without one."""
from __future__ import annotations

from psrv.experiments.launcher.summary import format_summary


def _lines(summary: dict) -> dict[str, str]:
    return dict(line.split(None, 1) for line in format_summary(summary).splitlines())


def test_a_language_model_shows_perplexity_and_no_accuracy_line():
    lines = _lines({"mode": "sync", "final_loss": 2.1, "eval_accuracy": None,
                    "eval_metrics": {"loss": 2.1, "perplexity": 8.166, "bits_per_byte": 3.03}})
    assert lines["eval_perplexity"] == "8.166" and lines["eval_bits_per_byte"] == "3.03"
    assert "eval_accuracy" not in lines and "eval_loss" not in lines


def test_a_classifier_shows_its_accuracy_once():
    text = format_summary({"mode": "sync", "final_loss": 0.2, "eval_accuracy": 0.9,
                           "eval_metrics": {"loss": 0.2, "accuracy": 0.9}})
    assert text.count("eval_accuracy") == 1 and "0.9" in _lines({"eval_accuracy": 0.9})["eval_accuracy"]


def test_a_run_with_no_evaluation_says_so():
    assert _lines({"mode": "sync", "eval_accuracy": None, "eval_metrics": None})["eval_accuracy"] == "n/a"


def test_a_diverged_simulation_says_why_and_a_real_run_has_no_such_line():
    lines = _lines({"mode": "async", "final_loss": 108.0, "eval_accuracy": 0.1, "diverged": True,
                    "diverged_why": "the final held-out loss 108 is above the initial 2.309"})
    assert lines["diverged"] == "yes: the final held-out loss 108 is above the initial 2.309"
    assert _lines({"mode": "sync", "eval_accuracy": 0.9, "diverged": False})["diverged"] == "no"
    assert "diverged" not in _lines({"mode": "sync", "eval_accuracy": 0.9})
