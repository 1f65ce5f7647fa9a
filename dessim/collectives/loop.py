"""The mean time of one iteration of nccl-tests' timed loop (docs/collectives.md, "Protocols").

nccl-tests times ``iters`` calls without synchronising between them (NVIDIA/nccl-tests
``src/common.cu``, ``BenchTime``: ``startColl`` in a loop, one ``completeColl`` after it;
``iters`` = 20 unless ``-n`` says otherwise). With ``-g G`` one host thread issues every call
as ``G`` NCCL calls, one per GPU, inside ``ncclGroupStart``/``ncclGroupEnd``: it spends
``host`` seconds per GPU, so it issues one call every ``G × host`` seconds, and the GPUs run
the calls one after another as they arrive on their streams. A call's kernels cannot finish
before the last of them has started:

* the first call ends at ``(G − 1) × host + t`` (``t``: the call's time once every rank has
  started, what :func:`~dessim.collectives.api.run_collective` reports with
  ``gpus_per_process=1``; ``(G − 1) × host + t`` is what it reports for ``G``, one isolated
  call);
* each later one ends ``max(G × host, t)`` after the previous one: the host issues a call
  every ``G × host`` (host-bound), or the next call's kernels already wait on every stream
  when the previous call ends (GPU-bound);

and nccl-tests prints the total divided by ``iters``. NVIDIA: with ``-g N`` "all GPUs are
handled by a single thread and that causes extra latency as the CPU is the bottleneck"
(sjeaugey, NVIDIA/nccl-tests#123).
"""

from __future__ import annotations

from dessim.errors import CollectiveError

#: nccl-tests' default number of timed iterations (``src/common.cu``: ``iters = 20``).
NCCL_TESTS_ITERS = 20


def nccl_tests_iteration_time(call: float, gpus_per_process: int, host: float,
                              iters: int = NCCL_TESTS_ITERS) -> float:
    """Seconds nccl-tests prints for a call of ``call`` seconds (every rank started at once),
    timed over ``iters`` back-to-back iterations by threads that each drive
    ``gpus_per_process`` GPUs and spend ``host`` seconds per GPU issuing a call (module
    docstring). One GPU per thread (MPI, ``-g 1``): ``max(host, call)`` per iteration."""
    if not (isinstance(gpus_per_process, int) and gpus_per_process >= 1):
        raise CollectiveError(f"gpus_per_process must be a whole number >= 1, "
                              f"got {gpus_per_process!r}")
    if not (isinstance(iters, int) and iters >= 1):
        raise CollectiveError(f"iters must be a whole number >= 1, got {iters!r}")
    if call < 0 or host < 0:
        raise CollectiveError(f"times must be >= 0, got call={call!r} host={host!r}")
    first = (gpus_per_process - 1) * host + call
    period = max(gpus_per_process * host, call)
    return (first + (iters - 1) * period) / iters
