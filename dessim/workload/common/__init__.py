"""What every kind of workload uses: precisions, kernels, task emission, gradient buckets,
device placement, workload documents and summary figures.

* :mod:`~dessim.workload.common.precision` — :class:`Precision` recipes (bf16, fp16, fp8, fp32);
* :mod:`~dessim.workload.common.kernels` — :class:`Kernel`, the GEMM / elementwise / backward
  conventions (:class:`KernelBuilder`), the optimizer step, :class:`KernelTimer`;
* :mod:`~dessim.workload.common.emitter` — :class:`TaskEmitter`: tasks of a generator;
* :mod:`~dessim.workload.common.gradsync` — gradient buckets (PyTorch DDP's policy);
* :mod:`~dessim.workload.common.placement` — the GPU model of every rank, offload node kinds,
  the nearest memory or storage node;
* :mod:`~dessim.workload.common.document` — key checking and merging of workload documents;
* :mod:`~dessim.workload.common.figures` — throughput, utilisation and exposed communication
  of one iteration, the same for every kind.
"""
