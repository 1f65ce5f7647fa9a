"""What NCCL launches for one collective call: channels, threads per channel, ring chunks.

NCCL decides this per call, after it chose the algorithm and protocol. A transcription of
**NCCL 2.30.7** (NVIDIA/nccl, commit 5067397c2676d5aed50042fc39e5c8ee96eb0027;
docs/references.md):

* ``topoGetAlgoInfo`` (``src/enqueue.cc``): Ring and Tree start from all the communicator's
  channels (``comm->nChannels``, :attr:`NcclSystem.execution_channels`) and drop one while
  ``nBytes < nc · nt · threshold`` (down to one), then halve the threads while
  ``nBytes < nc · nt · threshold`` and ``nt % 128 == 0``; Simple adds one warp to a ring
  ("extra warp for sync") and four to a tree; at least three warps; Tree and PAT always run
  ``NCCL_MAX_NTHREADS`` = 640 threads. NVLS and NVLSTree run ``nvlsChannels``
  (``NVLS_NCHANNELS_SM90`` = 16, ``_SM100`` = 32; NVLS across nodes at most
  ``comm->nChannels``); CollNetDirect steps down from 16 channels by
  ``nc · nt · nHeads · threshold``.
* thresholds (``src/include/comm.h``, end of ``ncclTopoTuneModel`` in
  ``src/graph/tuning.cc``): LL 8, LL128 8, Simple 64 bytes per thread; a ring's LL
  threshold × nRanks; CollNet Simple 512.
* threads (``ncclTopoTuneModel``): Ring Simple 512 (``NCCL_SIMPLE_MAX_NTHREADS``; 256 when
  ``bwIntra · nChannels <= PCI_BW`` = 12 GB/s), Tree Simple 512, CollNet and NVLS 640
  (``NCCL_MAX_NTHREADS``), LL 512 (``NCCL_LL_MAX_NTHREADS``), LL128 640.
* chunks (``calcCollChunking``, ``src/enqueue.cc``; buffer sizes ``src/init.cc``):
  ``stepSize = buffSize / NCCL_STEPS`` (8 steps; Simple 4 MiB, LL 512 KiB, LL128
  4,915,200 bytes); a Simple ring moves ``ALLREDUCE_CHUNKSTEPS`` = ``NCCL_STEPS / 2`` steps per
  chunk (all-gather, reduce-scatter alike; ``src/include/collectives.h``), everything else one;
  LL carries half its step in data, LL128 15/16. A ring channel walks its share in loops of
  ``nRanks`` chunks (``runRing``, ``src/device/all_reduce.h``).

This is what NCCL runs, reported with every ``auto`` choice. dessim does not time it:
the simulated ring inside a node is one lane at the links' full rate at every size
(docs/collectives.md, "What NCCL launches"). Units: bytes, threads, channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dessim.collectives.nccl.tuning import NcclSystem

__all__ = ["NcclLaunch", "launch", "THREAD_THRESHOLD", "MAX_THREADS", "BUFFER_BYTES",
           "NCCL_STEPS", "WARP_SIZE"]

NCCL_STEPS = 8
WARP_SIZE = 32
#: NCCL_MAX_NTHREADS: Tree, PAT, CollNet and NVLS kernels.
_MAX_NTHREADS = 640
#: NCCL's PCI_BW (GB/s): a ring whose channels together stay below it runs 256 Simple threads.
_PCI_BW = 12.0
#: Bytes per thread below which NCCL drops a channel (then halves the threads), by protocol.
THREAD_THRESHOLD: dict[str, int] = {"LL": 8, "LL128": 8, "Simple": 64}
#: ``comm->maxThreads`` by protocol (Ring and Tree; NVLS, CollNet: 640).
MAX_THREADS: dict[str, int] = {"LL": 512, "LL128": 640, "Simple": 512}
#: ``comm->buffSizes`` (bytes) by protocol: the defaults of ``computeBuffSizes``.
BUFFER_BYTES: dict[str, int] = {"LL": 8 * 512 * NCCL_STEPS * 16,
                                "LL128": 120 * 640 * NCCL_STEPS * 8,
                                "Simple": 1 << 22}
_NVLS_CHANNELS = {2: 16, 3: 32}      # by NCCL architecture row (HOPPER, BLACKWELL)
_RING_CHUNK_STEPS = {"allreduce": NCCL_STEPS // 2, "allgather": NCCL_STEPS // 2,
                     "reducescatter": NCCL_STEPS // 2}


@dataclass(frozen=True)
class NcclLaunch:
    """One call as NCCL launches it (see the module docstring)."""

    channels: int            #: channels (thread blocks) the call runs on
    max_channels: int        #: channels the communicator has for this algorithm
    threads: int             #: threads per channel
    chunk_bytes: int = 0     #: payload bytes of one ring chunk (0: not a ring)
    loops: int = 0           #: ring loops per channel (``nRanks`` chunks each)

    def describe(self) -> str:
        text = (f"NCCL launches {self.channels} of {self.max_channels} channels x "
                f"{self.threads} threads")
        if self.chunk_bytes:
            text += (f", ring chunks of {self.chunk_bytes / 1024:g} KiB, "
                     f"{self.loops} loop(s) per channel")
        return text


def _max_threads(algo: str, proto: str, system: NcclSystem) -> int:
    if algo in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain"):
        return _MAX_NTHREADS
    if algo == "ring" and proto == "Simple" and system.bw_intra * system.channels <= _PCI_BW:
        return 256
    return MAX_THREADS[proto]


def _threshold(algo: str, proto: str, system: NcclSystem) -> int:
    if algo.startswith("collnet") and proto == "Simple":
        return 512
    t = THREAD_THRESHOLD[proto]
    return t * system.ranks if (algo == "ring" and proto == "LL") else t


def launch(op: str, algo: str, proto: str, nbytes: float, system: NcclSystem) -> NcclLaunch:
    """How NCCL 2.30.7 launches ``op`` of ``nbytes`` (NCCL's ``nBytes``: the larger of the
    send and receive buffers, i.e. the nccl-tests size) with NCCL algorithm ``algo`` (a name
    of :data:`~dessim.collectives.nccl.tuning.ALGORITHMS`) and protocol ``proto`` on
    ``system``."""
    nbytes = int(nbytes)
    total = max(1, system.execution_channels or 2 * system.channels)
    nt = _max_threads(algo, proto, system)
    threshold = _threshold(algo, proto, system)
    if algo in ("nvls", "nvls_tree"):
        nc = total = _NVLS_CHANNELS.get(system.arch, 16)
        if system.nodes > 1 and algo == "nvls":
            nc = total = min(nc, max(1, system.execution_channels))
    elif algo == "collnet_direct":
        nc, heads, switch, more = total, max(1, system.collnet_heads), 16, True
        while switch >= 1 and more:
            while (more := nbytes < nc * nt * heads * threshold) and nc > switch:
                if nc == switch + switch // 2:
                    threshold //= 2
                nc -= 1
            switch //= 2
    else:
        nc = total
        while nbytes < nc * nt * threshold and nc >= 2:
            nc -= 1
    if algo not in ("nvls", "nvls_tree", "collnet_direct"):
        while nbytes < nc * nt * threshold and nt % 128 == 0:
            nt //= 2
    if proto == "Simple":
        nt += WARP_SIZE if algo == "ring" else 4 * WARP_SIZE if algo == "tree" else 0
    nt = max(nt, 3 * WARP_SIZE)
    if algo in ("tree", "pat"):
        nt = _MAX_NTHREADS
    chunk = loops = 0
    if algo == "ring":
        steps = _RING_CHUNK_STEPS.get(op, 1) if proto == "Simple" else 1
        chunk = BUFFER_BYTES[proto] // NCCL_STEPS * steps
        if proto == "LL":
            chunk //= 2
        elif proto == "LL128":
            chunk = chunk // 16 * 15
        loops = max(1, math.ceil(nbytes / (nc * system.ranks * chunk)))
    return NcclLaunch(nc, total, nt, chunk, loops)
