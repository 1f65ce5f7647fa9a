"""Recommendation models (``kind: dlrm``): :mod:`~dessim.workload.recsys.dlrm` (file schema,
task graph) and :mod:`~dessim.workload.recsys.dlrm_model` (embedding tables and their sharding)."""
