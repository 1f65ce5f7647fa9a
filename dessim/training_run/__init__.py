"""A whole training run from one simulated iteration: time to train, failures and goodput,
energy and cost, with uncertainty bands (docs/training-run.md).

Layer: above :mod:`dessim.workload` (it simulates iterations through
:func:`dessim.workload.simulate_workload`), below outputs, sweeps and the CLI.
"""

from dessim.training_run.options import TrainOptions, parse_train_options
from dessim.training_run.reliability import RenewalModel, daly_interval, optimal_interval, young_interval
from dessim.training_run.run import TrainingRunResult, simulate_training_run

__all__ = ["TrainOptions", "parse_train_options", "simulate_training_run", "TrainingRunResult",
           "RenewalModel", "young_interval", "daly_interval", "optimal_interval"]
