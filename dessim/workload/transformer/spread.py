"""Where a token's ``top_k`` expert copies land under skewed routing: exact hit probabilities.

The routing model (used by :class:`~dessim.workload.transformer.routing.MoERouting` for its
``zipf`` and ``counts`` distributions; the uniform case has closed forms there and this model
reduces to them exactly):

Maximum-entropy top-k routing
    A token's set ``S`` of ``k`` distinct experts is drawn with ``P(S) ∝ Π_{e∈S} w_e``
    (conditional Poisson sampling: independent per-expert choices conditioned on exactly
    ``k`` of them — the maximum-entropy distribution over ``k``-subsets with given inclusion
    probabilities; Chen, Dempster & Liu 1994, "Weighted finite population sampling to maximize
    entropy", Biometrika 81(3):457–469). The weights ``w`` are solved so that each expert's
    inclusion probability ``π_e`` equals ``k · s_e`` — ``s_e`` its share of the token copies —
    so the routed loads are exactly the distribution's: steps
    ``log w ← log w + α·(logit(k·s) − logit(π(w)))``, ``α`` chosen to shrink the squared gap
    to the targets, until every ``π_e`` is within :data:`TOLERANCE` of its target — a
    numerical solve checked to that tolerance, not an approximation. Given the targets the
    weights are essentially unique (Chen, Dempster & Liu 1994). An expert with
    ``k · s_e ≥ 1`` cannot receive that many copies (a token picks an expert at most once):
    it is taken by every token (``π_e = 1``) and the other ``k − c`` picks are spread over
    the rest in proportion to their shares (repeated until no target exceeds 1). Experts
    with share 0 are never picked.
Node-limited routing (DeepSeek-V3 report, arXiv 2412.19437, §2.1.2)
    "each token will be sent to at most M nodes": first a set ``N`` of ``M' = min(M, H)`` of the
    ``H`` nodes, then the ``k`` experts among the experts of ``N``. Jointly,
    ``P(N, S) ∝ Π_{e∈S} w_e`` over node sets ``|N| = M'`` and ``S ⊆ experts(N)``: a node set
    is as likely as the routing weight it offers, and inside it the experts follow the
    maximum-entropy router above. Uniform weights give a uniform node set and a uniform
    ``k``-subset of its experts — the uniform model of
    :mod:`~dessim.workload.transformer.routing`. The weights are those solved without the
    node limit (the router's preferences); with it, the per-expert loads are no longer
    exactly the shares (a node set is weighted by the experts it offers): for DeepSeek-V3's
    shape (256 experts, top-8, 8 nodes of 8 GPUs, M = 4) the hottest GPU's load over the mean
    is 21.6 against the shares' 21.8 under Zipf exponent 1, but 8.4 against 5.8 under
    exponent 0.5. Solving the weights under the limit instead is not always possible (Zipf
    shares on contiguous blocks often cannot come from a router limited to few nodes: with
    ``M = 1`` a node is hit with probability equal to its experts' share, and none of its
    experts can be picked more often), so it is not done;
    the load factor keeps the shares.

Computation (exact, no sampling): with ``W(S) = Π w_e`` and ``d(S)`` the nodes ``S`` touches,
the normaliser is ``Z = Σ_S W(S) · C(H − d(S), M' − d(S))`` (the node sets containing S's
nodes); a dynamic programme over nodes with state (nodes touched, experts picked) and each
node's generating polynomial ``Π_{e on node} (1 + w_e x)`` gives it in
``O(H · M' · k²)``. A node (GPU) is missed with probability ``Z'/Z``, ``Z'`` the same sum with
that node's (GPU's) experts removed; prefix and suffix tables over the nodes give every
``Z'`` from the table of the other nodes in ``O(M' · k)``, ``O(H · (M' · k)²)`` in all. Experts sit in contiguous blocks: GPU ``g`` holds experts
``g·E/(H·n) …``, node ``h`` GPUs ``h·n … h·n + n − 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb, exp, log
from typing import Sequence

from dessim.errors import WorkloadError

__all__ = ["Spread", "solve_weights", "inclusion", "hit_probabilities"]

#: Fixed-point iteration of :func:`solve_weights`: stop when every inclusion probability is
#: within this of its target (absolute; probabilities are <= 1) ...
TOLERANCE = 1e-12
#: ... or fail after this many rounds (a WorkloadError; never a silently wrong number).
MAX_ROUNDS = 10_000


@dataclass(frozen=True, slots=True)
class Spread:
    """Per-token hit probabilities: ``node_hit[h]`` that node ``h`` receives at least one of
    the token's expert copies, ``gpu_hit[g]`` that GPU ``g`` does (dimensionless);
    ``nodes``/``gpus``: the expected numbers of distinct nodes/GPUs hit (their sums, or the
    exact closed forms in the uniform case)."""

    node_hit: tuple[float, ...]
    gpu_hit: tuple[float, ...]
    nodes: float
    gpus: float


def _mul(a: Sequence[float], b: Sequence[float], k: int) -> list[float]:
    """Product of two polynomials (coefficient lists), truncated above degree ``k``."""
    out = [0.0] * (k + 1)
    for i, x in enumerate(a):
        if x:
            for j in range(min(len(b), k + 1 - i)):
                out[i + j] += x * b[j]
    return out


def _poly(weights: Sequence[float], certain: Sequence[bool], k: int) -> list[float]:
    """Generating polynomial of a block of experts: ``x^c · Π (1 + w x)``, ``c`` certain ones."""
    p = [1.0] + [0.0] * k
    for w, c in zip(weights, certain):
        p = _mul(p, [0.0, 1.0] if c else [1.0, w], k)
    return p


def inclusion(weights: Sequence[float], certain: Sequence[bool], k: int) -> list[float]:
    """Inclusion probability of each expert under the maximum-entropy router (module
    docstring) without a node limit: ``π_e = w_e · e_{k'−1}(w_{−e}) / e_{k'}(w)`` over the
    uncertain experts (``k'`` = ``k`` − certain ones), 1 for certain ones; prefix and suffix
    products of the generating polynomial keep it ``O(E · k²)`` and free of cancellation."""
    free = [w for w, c in zip(weights, certain) if not c]
    kk = k - sum(certain)
    n = len(free)
    pre = [[1.0] + [0.0] * kk]
    for w in free:
        pre.append(_mul(pre[-1], [1.0, w], kk))
    suf = [[1.0] + [0.0] * kk]
    for w in reversed(free):
        suf.append(_mul(suf[-1], [1.0, w], kk))
    suf.reverse()
    total = pre[n][kk] if kk >= 0 else 0.0
    out_free = []
    for i, w in enumerate(free):
        if kk == 0 or w == 0.0:
            out_free.append(0.0)
            continue
        rest = sum(pre[i][j] * suf[i + 1][kk - 1 - j] for j in range(kk))
        out_free.append(w * rest / total)
    it = iter(out_free)
    return [1.0 if c else next(it) for c in certain]


def solve_weights(shares: Sequence[float], k: int) -> tuple[list[float], list[bool]]:
    """Router weights ``w`` and certain experts such that every expert's inclusion
    probability is ``k · share`` (certain experts: 1; module docstring). A WorkloadError when
    fewer than ``k`` experts have a positive share or the iteration does not converge."""
    if sum(1 for s in shares if s > 0) < k:
        raise WorkloadError(f"model routing: only {sum(1 for s in shares if s > 0)} experts have "
                            f"a share > 0, fewer than top_k={k}")
    certain = [False] * len(shares)
    while True:                     # an expert wanted by every token is taken by every token
        rest = sum(s for s, c in zip(shares, certain) if not c)
        left = k - sum(certain)
        target = [1.0 if c else (left * s / rest if rest > 0 else 0.0) for s, c in zip(shares, certain)]
        new = [c or t >= 1.0 - TOLERANCE for c, t in zip(certain, target)]
        if new == certain:
            break
        certain = new
    weights = [0.0] * len(shares)
    active = [i for i, (c, t) in enumerate(zip(certain, target)) if not c and t > 0]
    if left == 0:
        return weights, certain
    want = [target[i] for i in active]
    theta = [log(t) for t in want]
    gap = _gap(theta, want, left)
    for _ in range(MAX_ROUNDS):
        if max(abs(g) for g in gap) <= TOLERANCE:
            w = [exp(x - max(theta)) for x in theta]
            mean = sum(w) / len(w)
            for i, x in zip(active, w):
                weights[i] = x / mean
            return weights, certain
        step = [_logit(t) - _logit(t + g) for t, g in zip(want, gap)]
        moved = _advance(theta, step, gap, want, left)
        if moved is None:
            break
        theta, gap = moved
    raise WorkloadError(f"model routing: the router weights for top_k={k} did not converge "
                        f"(shares {min(shares):.3g}..{max(shares):.3g}); the largest gap to the "
                        f"target loads is {max(abs(g) for g in gap):.3g}")


def _advance(theta: list[float], step: list[float], gap: list[float], want: list[float],
             k: int) -> tuple[list[float], list[float]] | None:
    """``θ + α·step`` and its gap, for the ``α`` in (0, 1] that shrinks the squared gap: the
    full step if it quarters it, else the minimiser of the gap's linearisation through the full
    step (the log-odds step overshoots when hot experts compete), else halvings; None when no
    ``α ≥ 2^-40`` helps (rounding)."""
    def at(alpha: float) -> tuple[list[float], list[float]]:
        trial = [x + alpha * d for x, d in zip(theta, step)]
        return trial, _gap(trial, want, k)

    def norm(g: Sequence[float]) -> float:
        return sum(x * x for x in g)

    base = norm(gap)
    full = at(1.0)
    if norm(full[1]) <= base / 4:
        return full
    change = [a - b for a, b in zip(full[1], gap)]
    alpha = -sum(g * c for g, c in zip(gap, change)) / max(norm(change), 1e-300)
    alpha = min(max(alpha, 2.0 ** -10), 1.0)
    while alpha >= 2.0 ** -40:
        moved = at(alpha)
        if norm(moved[1]) < base:
            return moved
        alpha /= 2
    return None


def _logit(p: float) -> float:
    p = min(max(p, 1e-300), 1.0 - 1e-16)
    return log(p / (1.0 - p))


def _gap(theta: Sequence[float], want: Sequence[float], k: int) -> list[float]:
    """Inclusion probabilities for weights ``e^θ`` minus their targets."""
    top = max(theta)
    w = [exp(x - top) for x in theta]
    return [p - t for p, t in zip(inclusion(w, [False] * len(w), k), want)]


class _Tables:
    """Dynamic-programme tables over nodes: ``t[d][j]`` sums ``W(S)`` over the choices on a
    set of nodes that touch ``d`` of them with ``j`` experts (``d`` capped at ``reach``; a
    single row when every node set is allowed, ``M' = H``, where ``d`` does not matter)."""

    def __init__(self, k: int, hosts: int, reach: int) -> None:
        self.k, self.hosts, self.reach = k, hosts, reach
        self.rows = reach + 1 if reach < hosts else 1

    def unit(self) -> list[list[float]]:
        t = [[0.0] * (self.k + 1) for _ in range(self.rows)]
        t[0][0] = 1.0
        return t

    def add(self, t: list[list[float]], q: Sequence[float]) -> list[list[float]]:
        """``t`` with one more node of generating polynomial ``q``."""
        k, rows = self.k, self.rows
        new = [[x * q[0] for x in row] for row in t]
        for d in range(rows if rows == 1 else rows - 1):
            up = d if rows == 1 else d + 1
            for j, x in enumerate(t[d]):
                if x:
                    for i in range(1, k + 1 - j):
                        new[up][j + i] += x * q[i]
        return new

    def merge(self, a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
        """The table of two disjoint node sets."""
        k, rows = self.k, self.rows
        out = [[0.0] * (k + 1) for _ in range(rows)]
        for d1, ra in enumerate(a):
            for d2, rb in enumerate(b):
                d = 0 if rows == 1 else d1 + d2
                if d >= rows:
                    continue
                for j1, x in enumerate(ra):
                    if x:
                        for j2 in range(k + 1 - j1):
                            out[d][j1 + j2] += x * rb[j2]
        return out

    def close(self, others: list[list[float]], q: Sequence[float]) -> float:
        """``Z`` (module docstring) of the nodes of ``others`` plus one of polynomial ``q``:
        the ``k``-expert entries, each weighted by the node sets containing its nodes."""
        k, hosts, reach, rows = self.k, self.hosts, self.reach, self.rows

        def sets(d: int) -> int:
            return 1 if rows == 1 else (comb(hosts - d, reach - d) if d <= reach else 0)

        total = 0.0
        for d, row in enumerate(others):
            for j, x in enumerate(row):
                if x:
                    total += x * (q[0] * sets(d) if j == k else q[k - j] * sets(d + 1))
        return total


def hit_probabilities(weights: Sequence[float], certain: Sequence[bool], k: int, hosts: int,
                      per_host: int, max_nodes: int | None) -> Spread:
    """Exact node and GPU hit probabilities of one token (module docstring) for experts in
    contiguous blocks over ``hosts · per_host`` GPUs (the caller checks divisibility)."""
    gpus = hosts * per_host
    per_gpu = len(weights) // gpus
    reach = hosts if max_nodes is None else min(max_nodes, hosts)
    blocks = [(weights[g * per_gpu:(g + 1) * per_gpu], certain[g * per_gpu:(g + 1) * per_gpu])
              for g in range(gpus)]
    gpu_polys = [_poly(w, c, k) for w, c in blocks]
    empty = [1.0] + [0.0] * k
    zero = [0.0] * (k + 1)

    def node_poly(h: int, without: int = -1) -> list[float]:
        p = empty
        for g in range(h * per_host, (h + 1) * per_host):
            if g != without:
                p = _mul(p, gpu_polys[g], k)
        return p

    node_polys = [node_poly(h) for h in range(hosts)]
    tables = _Tables(k, hosts, reach)
    prefix = [tables.unit()]                  # prefix[h]: nodes 0..h-1; suffix[h]: h..H-1
    for q in node_polys:
        prefix.append(tables.add(prefix[-1], q))
    suffix = [tables.unit()]
    for q in reversed(node_polys):
        suffix.append(tables.add(suffix[-1], q))
    suffix.reverse()
    others = [tables.merge(prefix[h], suffix[h + 1]) for h in range(hosts)]
    z = tables.close(others[0], node_polys[0])

    def missed(h: int, poly: list[float]) -> float:
        return tables.close(others[h], poly) / z

    node_hit = tuple(1.0 - missed(h, zero if any(any(c) for _, c in blocks[h * per_host:(h + 1) * per_host])
                                  else empty) for h in range(hosts))
    gpu_hit = tuple(1.0 - (0.0 if any(blocks[g][1]) else missed(g // per_host, node_poly(g // per_host, g)))
                    for g in range(gpus))
    return Spread(node_hit, gpu_hit, sum(node_hit), sum(gpu_hit))
