"""Data-parallel training of a stack of layers: what the recommendation (:mod:`~dessim.workload.recsys`)
and vision (:mod:`~dessim.workload.vision`) kinds share.

* :mod:`~dessim.workload.dataparallel.spec` — the file sections every such kind has
  (``training``, ``compression``, ``input``) and how overrides reach them;
* :mod:`~dessim.workload.dataparallel.graph` — forward, backward (with bucketed gradient
  reductions) and optimizer passes over a list of :class:`~dessim.workload.dataparallel.graph.Layer`;
* :mod:`~dessim.workload.dataparallel.compression` — gradient compression of a bucket;
* :mod:`~dessim.workload.dataparallel.io` — the input pipeline (storage and host cache reads);
* :mod:`~dessim.workload.dataparallel.result` — :class:`DPResult`, the outcome of one iteration.
"""
