"""Transformer training (dense and mixture-of-experts, ``kind: transformer``, the default).

* :mod:`~dessim.workload.transformer.model` — :class:`TransformerConfig` and parameter counts;
* :mod:`~dessim.workload.transformer.layout` — :class:`ParallelLayout` (TP/PP/DP/CP/EP, ZeRO,
  schedules): validation, rank placement, groups;
* :mod:`~dessim.workload.transformer.kernels` — the kernels of a layer, embedding and LM head;
* :mod:`~dessim.workload.transformer.flops` — model/hardware FLOPs per iteration, MFU;
* :mod:`~dessim.workload.transformer.memory` — per-GPU memory estimates, :func:`check_fit`;
* :mod:`~dessim.workload.transformer.spec` — workload files and presets (:func:`load_workload`);
* :mod:`~dessim.workload.transformer.plan` — overrides, validation and memory fit on a
  topology (:func:`plan_workload`), :func:`enumerate_layouts`;
* :mod:`~dessim.workload.transformer.schedules` — pipeline orderings (GPipe, 1F1B, interleaved);
* :mod:`~dessim.workload.transformer.passes` — per-pass step templates (where TP/SP/EP/CP/ZeRO-3
  communication and offload go); :mod:`~dessim.workload.transformer.stage_passes` — a whole
  pass as few tasks; :mod:`~dessim.workload.transformer.tp_islands` — TP collectives in closed
  form;
* :mod:`~dessim.workload.transformer.generator` — :func:`build_taskgraph`: the task graph of
  one iteration; :mod:`~dessim.workload.transformer.result` — :class:`WorkloadResult`.

The package front :mod:`dessim.workload` re-exports the public names.
"""
