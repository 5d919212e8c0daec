"""Goodput of a run with faults (docs/reliability.md, "Goodput"): its useful samples per second against a
fault-free run's, the samples lost or applied twice, and what each fault cost, from the processes' histories
(docs/history.md) and the faults done. steps: the pushes and their fate; measure: the arithmetic; report: the
summary.json blocks."""
from psrv.experiments.launcher.goodput.measure import Measured, fault_costs, measure
from psrv.experiments.launcher.goodput.report import baseline, faults_done, goodput, reckon
from psrv.experiments.launcher.goodput.steps import RunSteps, Step, read_steps

__all__ = ["Measured", "RunSteps", "Step", "baseline", "fault_costs", "faults_done", "goodput", "measure",
           "read_steps", "reckon"]
