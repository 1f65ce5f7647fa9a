"""Throughput and utilisation of one simulated iteration, the same figures for every workload kind
(MFU and HFU: Chowdhery et al. 2022 / Korthikanti et al. 2022, as in
:mod:`dessim.workload.transformer.flops`).
"""

from __future__ import annotations

__all__ = ["rate_figures"]


def rate_figures(iteration_s: float, samples: float, tokens_per_sample: float,
                 model_flops: float, hardware_flops: float, gpus: int,
                 peak_flops: float) -> dict[str, float]:
    """Throughput and utilisation of one iteration, shared by every workload kind.

    ``samples`` per iteration (the global batch), ``model_flops``/``hardware_flops`` per
    iteration for the whole cluster, ``peak_flops`` the summed dense peak of all GPUs (FLOP/s).
    MFU = model FLOP/s / peak; HFU counts recomputation too. Zero when the iteration is empty.
    """
    def rate(x: float) -> float:
        return x / iteration_s if iteration_s > 0 else 0.0

    return {
        "iteration_s": iteration_s,
        "tokens_per_s": rate(samples * tokens_per_sample),
        "samples_per_s": rate(samples),
        "model_flops": model_flops,
        "hardware_flops": hardware_flops,
        "model_tflops_per_gpu": rate(model_flops) / gpus / 1e12,
        "hardware_tflops_per_gpu": rate(hardware_flops) / gpus / 1e12,
        "mfu": rate(model_flops) / peak_flops if peak_flops else 0.0,
        "hfu": rate(hardware_flops) / peak_flops if peak_flops else 0.0,
    }
