"""What every kind of workload uses: precisions, kernels, task emission, gradient buckets,
device placement, workload documents and rate figures.

* :mod:`~dessim.workload.common.precision` — :class:`Precision` recipes (bf16, fp16, fp8, fp32);
* :mod:`~dessim.workload.common.kernels` — :class:`Kernel`, the GEMM / elementwise / backward
  conventions (:class:`KernelBuilder`), the optimizer step, :class:`KernelTimer`;
* :mod:`~dessim.workload.common.emitter` — :class:`TaskEmitter`: tasks of a generator;
* :mod:`~dessim.workload.common.gradsync` — gradient buckets, the nearest far-memory node;
* :mod:`~dessim.workload.common.placement` — the GPU model of every rank, offload node kinds;
* :mod:`~dessim.workload.common.document` — key checking and merging of workload documents;
* :mod:`~dessim.workload.common.rates` — throughput and utilisation of one iteration.
"""
