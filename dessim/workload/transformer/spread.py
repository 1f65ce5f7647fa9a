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
    :mod:`~dessim.workload.transformer.routing`. The weights are solved *under* the limit
    (:func:`solve_limited_weights`: the same log-odds iteration on the limited model's
    inclusion probabilities, :func:`limited_inclusion`, started from the unlimited weights),
    so that every expert's load is again exactly its target and the load factor, computed
    from the shares, holds. This is an exponential family over the allowed (node set, expert
    set) pairs, so the weights exist exactly when the targets lie in the relative interior of
    the convex hull of the allowed choices (Wainwright & Jordan 2008, "Graphical Models, Exponential Families,
    and Variational Inference", Thm. 3.3); a limited router cannot always have the loads —
    with ``M = 1`` all ``k`` picks fall on one node, so no expert can take more than ``1/k``
    of its node's load (Zipf exponent 1 on DeepSeek-V3's shape breaks it). When the
    iteration does not get every gap within :data:`TOLERANCE` in :data:`LIMITED_ROUNDS`
    steps, the unlimited weights are kept, the spread says so (``loads_matched`` False) and
    runs name it among their approximations. Without matching, the loads would differ from
    the shares (DeepSeek-V3's shape, 256 experts, top-8, 8 nodes of 8 GPUs, M = 4: hottest
    GPU 21.6× the mean against the shares' 21.8× under Zipf exponent 1, 8.4× against 5.8×
    under 0.5); matched, both runs keep the shares' loads. On that shape the match takes
    0.15–0.4 s (Zipf 0.2–1.2, M = 2 or 4) and 2 s for Zipf 0.5 with M = 1.

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
from typing import Callable, Sequence

from dessim.errors import WorkloadError

__all__ = ["Spread", "solve_weights", "solve_limited_weights", "inclusion", "limited_inclusion",
           "hit_probabilities"]

#: Fixed-point iteration of :func:`solve_weights`: stop when every inclusion probability is
#: within this of its target (absolute; probabilities are <= 1) ...
TOLERANCE = 1e-12
#: ... or fail after this many rounds (a WorkloadError; never a silently wrong number).
MAX_ROUNDS = 10_000
#: Steps of :func:`solve_limited_weights` from the unlimited weights before it gives up (the
#: limited router may not be able to have the loads; DeepSeek-V3's shape with Zipf exponent
#: 0.5 and M = 4 converges in a few hundred).
LIMITED_ROUNDS = 2_000


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
    #: whether every expert's load under the router is its target (False: a node-limited
    #: router that cannot have the loads, whose weights are matched without the limit)
    loads_matched: bool = True


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


def _targets(shares: Sequence[float], k: int) -> tuple[list[float], list[bool], int]:
    """Each expert's target inclusion probability, the certain experts and the picks left
    for the others (an expert wanted by every token is taken by every token; module
    docstring)."""
    if sum(1 for s in shares if s > 0) < k:
        raise WorkloadError(f"model routing: only {sum(1 for s in shares if s > 0)} experts have "
                            f"a share > 0, fewer than top_k={k}")
    certain = [False] * len(shares)
    while True:
        rest = sum(s for s, c in zip(shares, certain) if not c)
        left = k - sum(certain)
        target = [1.0 if c else (left * s / rest if rest > 0 else 0.0) for s, c in zip(shares, certain)]
        new = [c or t >= 1.0 - TOLERANCE for c, t in zip(certain, target)]
        if new == certain:
            return target, certain, left
        certain = new


def _weights(theta: Sequence[float], active: Sequence[int], size: int) -> list[float]:
    """Weights ``e^θ`` of the ``active`` experts, scaled to mean 1, 0 for the others."""
    w = [exp(x - max(theta)) for x in theta]
    mean = sum(w) / len(w)
    weights = [0.0] * size
    for i, x in zip(active, w):
        weights[i] = x / mean
    return weights


def _iterate(theta: list[float], want: list[float], gap_of: Callable[[list[float]], list[float]],
             rounds: int) -> tuple[list[float], list[float], bool]:
    """The log-odds iteration of :func:`solve_weights` from ``θ`` until every gap is within
    :data:`TOLERANCE`: ``(θ, gap, converged)`` after at most ``rounds`` steps."""
    gap = gap_of(theta)
    for _ in range(rounds):
        if max(abs(g) for g in gap) <= TOLERANCE:
            return theta, gap, True
        step = [_logit(t) - _logit(t + g) for t, g in zip(want, gap)]
        moved = _advance(theta, step, gap, gap_of)
        if moved is None:
            break
        theta, gap = moved
    return theta, gap, max(abs(g) for g in gap) <= TOLERANCE


def solve_weights(shares: Sequence[float], k: int) -> tuple[list[float], list[bool]]:
    """Router weights ``w`` and certain experts such that every expert's inclusion
    probability is ``k · share`` (certain experts: 1; module docstring). A WorkloadError when
    fewer than ``k`` experts have a positive share or the iteration does not converge."""
    target, certain, left = _targets(shares, k)
    active = [i for i, (c, t) in enumerate(zip(certain, target)) if not c and t > 0]
    if left == 0:
        return [0.0] * len(shares), certain
    want = [target[i] for i in active]
    theta, gap, converged = _iterate([log(t) for t in want], want,
                                     lambda th: _gap(th, want, left), MAX_ROUNDS)
    if converged:
        return _weights(theta, active, len(shares)), certain
    raise WorkloadError(f"model routing: the router weights for top_k={k} did not converge "
                        f"(shares {min(shares):.3g}..{max(shares):.3g}); the largest gap to the "
                        f"target loads is {max(abs(g) for g in gap):.3g}")


def solve_limited_weights(shares: Sequence[float], k: int, hosts: int, max_nodes: int,
                          start: tuple[list[float], list[bool]] | None = None
                          ) -> tuple[list[float], list[bool]] | None:
    """Router weights under node-limited routing (module docstring) such that every expert's
    inclusion probability is its target (``k · share``, certain experts 1), for experts in
    contiguous blocks over ``hosts`` nodes and at most ``max_nodes`` of them per token; None
    when the iteration, started from the unlimited weights, does not bring every gap within
    :data:`TOLERANCE` in :data:`LIMITED_ROUNDS` steps — a limited router often cannot have
    those loads at all (module docstring) — so that what is returned is always an exact
    match. ``start``: :func:`solve_weights`'s answer, when the caller has it."""
    target, certain, left = _targets(shares, k)
    weights, _ = start if start is not None else solve_weights(shares, k)
    active = [i for i, (c, t) in enumerate(zip(certain, target)) if not c and t > 0]
    if left == 0:
        return weights, certain
    want = [target[i] for i in active]

    def gap_of(theta: list[float]) -> list[float]:
        try:
            pi = limited_inclusion(_weights(theta, active, len(shares)), certain, k, hosts, max_nodes)
        except WorkloadError:       # weights with no valid choice left: a step to reject
            return [float("inf")] * len(want)
        return [pi[i] - t for i, t in zip(active, want)]

    theta, _, converged = _iterate([log(weights[i]) for i in active], want, gap_of, LIMITED_ROUNDS)
    return (_weights(theta, active, len(shares)), certain) if converged else None


def _advance(theta: list[float], step: list[float], gap: list[float],
             gap_of: Callable[[list[float]], list[float]]) -> tuple[list[float], list[float]] | None:
    """``θ + α·step`` and its gap, for the ``α`` in (0, 1] that shrinks the squared gap: the
    full step if it quarters it, else the minimiser of the gap's linearisation through the full
    step (the log-odds step overshoots when hot experts compete), else halvings; None when no
    ``α ≥ 2^-40`` helps (rounding)."""
    def at(alpha: float) -> tuple[list[float], list[float]]:
        trial = [x + alpha * d for x, d in zip(theta, step)]
        return trial, gap_of(trial)

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


def _node_tables(node_polys: Sequence[list[float]], k: int,
                 reach: int) -> tuple[_Tables, list[list[list[float]]], float]:
    """The tables of the nodes' generating polynomials: for each node the table of all the
    other nodes (prefix and suffix tables merged), and the normaliser ``Z``."""
    hosts = len(node_polys)
    tables = _Tables(k, hosts, reach)
    prefix = [tables.unit()]                  # prefix[h]: nodes 0..h-1; suffix[h]: h..H-1
    for q in node_polys:
        prefix.append(tables.add(prefix[-1], q))
    suffix = [tables.unit()]
    for q in reversed(node_polys):
        suffix.append(tables.add(suffix[-1], q))
    suffix.reverse()
    others = [tables.merge(prefix[h], suffix[h + 1]) for h in range(hosts)]
    return tables, others, tables.close(others[0], node_polys[0])


def limited_inclusion(weights: Sequence[float], certain: Sequence[bool], k: int, hosts: int,
                      max_nodes: int | None) -> list[float]:
    """Inclusion probability of each expert under node-limited routing (module docstring),
    experts in contiguous blocks over ``hosts`` nodes: ``π_e = w_e · Z_e / Z``, ``Z_e`` the
    normaliser over the choices that hold ``e`` — the other nodes' table closed with ``e``'s
    node polynomial without ``e``, times ``x`` (prefix and suffix products inside the node, no
    cancellation); 1 for certain experts. Without a limit (``max_nodes`` None or ``>=
    hosts``) it equals :func:`inclusion`."""
    per = len(weights) // hosts
    reach = hosts if max_nodes is None else min(max_nodes, hosts)
    factors = [[0.0, 1.0] if c else [1.0, w] for w, c in zip(weights, certain)]
    node_polys = []
    for h in range(hosts):
        p = [1.0] + [0.0] * k
        for f in factors[h * per:(h + 1) * per]:
            p = _mul(p, f, k)
        node_polys.append(p)
    tables, others, z = _node_tables(node_polys, k, reach)
    if not z > 0.0:
        raise WorkloadError(f"model routing: no choice of top_k={k} experts on at most {reach} "
                            "nodes has a positive weight (the certain experts span more nodes)")
    out = []
    for h in range(hosts):
        block = factors[h * per:(h + 1) * per]
        pre = [[1.0] + [0.0] * k]
        for f in block:
            pre.append(_mul(pre[-1], f, k))
        suf = [[1.0] + [0.0] * k]
        for f in reversed(block):
            suf.append(_mul(suf[-1], f, k))
        suf.reverse()
        for i in range(per):
            e = h * per + i
            if certain[e] or weights[e] == 0.0:
                out.append(1.0 if certain[e] else 0.0)
                continue
            rest = _mul(pre[i], suf[i + 1], k)
            out.append(tables.close(others[h], [0.0] + [weights[e] * x for x in rest[:k]]) / z)
    return out


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
    tables, others, z = _node_tables(node_polys, k, reach)
    if not z > 0.0:
        hot = sorted({g // per_host for g, (_, c) in enumerate(blocks) if any(c)})
        raise WorkloadError(f"model routing: every token must take the experts that get more than "
                            f"1/top_k of the tokens (top_k={k}), and they sit on {len(hot)} nodes "
                            f"{hot}, more than max_nodes={reach} allows: no node-limited routing "
                            "serves these loads (raise max_nodes or flatten the counts)")

    def missed(h: int, poly: list[float]) -> float:
        return tables.close(others[h], poly) / z

    node_hit = tuple(1.0 - missed(h, zero if any(any(c) for _, c in blocks[h * per_host:(h + 1) * per_host])
                                  else empty) for h in range(hosts))
    gpu_hit = tuple(1.0 - (0.0 if any(blocks[g][1]) else missed(g // per_host, node_poly(g // per_host, g)))
                    for g in range(gpus))
    return Spread(node_hit, gpu_hit, sum(node_hit), sum(gpu_hit))
