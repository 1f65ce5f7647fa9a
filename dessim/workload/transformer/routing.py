"""How a mixture-of-experts router spreads tokens over experts, and what that costs.

Every MoE layer sends each token to ``top_k`` of ``experts`` routed experts. With perfectly
balanced routing every expert-parallel (EP) rank processes ``top_k·T`` token copies per
micro-batch (``T`` tokens per rank). Real routers are not balanced; the all-to-all and the
expert GEMMs then wait for the most loaded rank. :class:`MoERouting` describes the load:

``uniform``
    every expert equally popular (the balanced case; DeepSeek-V3's auxiliary-loss-free
    balancing aims at it, report §2.1.2).
``zipf``
    expert ``i`` (0-based, in popularity order) receives a share ``∝ 1/(i+1)^exponent``
    (exponent 0 = uniform).
``counts``
    measured tokens per expert (a list in the workload file, or a file of one count per line,
    e.g. a router's histogram over a training batch), in expert order.

Experts are placed on EP ranks in contiguous blocks (expert ``e`` on rank ``e // (E/ep)``,
Megatron-LM's and DeepSeek's layout), so a rank's load is the sum of its experts' shares.
``load_factor`` = the most loaded rank's tokens / the mean: the expert GEMMs and the
dispatch/combine all-to-all of every rank are costed at that rank's size (bulk-synchronous:
the next layer waits for the slowest rank).

Capacity factor ``C`` (Switch Transformer, Fedus et al. 2022, §2.2): an expert takes at most
``C · top_k·T_total / E`` tokens; the rest are dropped (they skip the expert and keep their
residual). The rank's load is then capped, and :meth:`MoERouting.dropped_fraction` reports the
share of token copies dropped. ``None`` = no capacity limit (dropless, DeepSeek-V3 §3.1: "no
token-dropping").

Node-limited routing ``max_nodes`` = ``M`` (DeepSeek-V3 report §2.1.2: "each token will be
sent to at most M nodes", M = 4 in its training; the released config's ``topk_group``): a
token's ``top_k`` experts lie on at most ``M`` of the ``H`` nodes its expert-parallel group
spans. It changes no FLOP and no load factor; it changes what crosses the network when the
dispatch sends a token *once per node* (DeepEP, report §3.2.2: a token crosses InfiniBand to
each of its target nodes once, then NVLink fans it out to the GPUs of its experts;
``moe_dispatch: deepep``). :meth:`MoERouting.nodes_per_token` is the expected number of
distinct nodes a token reaches, exactly, under uniform affinities (each node subset and each
expert inside it equally likely: the balanced case the load-balancing aims at), experts in
contiguous blocks of ``E/H`` per node::

    D = M'·(1 − C((M'−1)·E/H, k) / C(M'·E/H, k)),   M' = min(M, H)   (M absent: M' = H)

(a node is missed when all ``k`` experts fall on the other ``M' − 1`` chosen nodes). A flat
all-to-all sends ``k`` copies per token, ``k·(H−1)/H`` of them to other nodes; the deduplicated
dispatch sends ``D·(H−1)/H``, so its network bytes are the flat ones times
:meth:`MoERouting.network_share` ``= D / k`` — at most ``M/k``: a token's cross-node bytes are
bounded by ``M`` hidden vectors.

Inside the target node DeepEP forwards a token once per *target GPU* (``is_token_in_rank``
of deepseek-ai/DeepEP ``csrc/kernels/internode.cu``), and not at all to the forwarding GPU
itself. With ``n`` GPUs per node and ``E/(H·n)`` experts per GPU, the expected number of
distinct target GPUs per token is, likewise exactly under uniform affinities::

    G = M'·n·(1 − C((M'·n−1)·E/(H·n), k) / C(M'·n·E/(H·n), k))

(a node's ``n`` GPUs in ``n`` blocks of its ``E/H`` experts). The flat fan-out forwards the
``k·(n−1)/n`` copies (in expectation) not on the forwarding GPU; DeepEP forwards once to each
target GPU but that one, ``G·(n−1)/n`` (each GPU of a node equally likely to be the forwarding
one, the token's home index), so the NVLink phase carries the flat bytes times
:meth:`MoERouting.nvlink_share` ``= G / k``.

Skewed distributions (``zipf``, ``counts``) use the exact hit probabilities of a
maximum-entropy router whose per-expert loads are the distribution's
(:mod:`dessim.workload.transformer.spread`: conditional Poisson sampling, Chen, Dempster &
Liu 1994; node-limited as DeepSeek-V3 §2.1.2: first the ``M`` nodes, then the ``k`` experts among
them, the router's weights solved under the limit so that the loads stay the distribution's
where a limited router can have them); uniform shares give the closed forms above. Bulk-synchronous costing: every rank's
all-to-all is sized for the most loaded EP rank (``load_factor``: copies ``k·max_g s_g`` per
token from each source, ``s_g`` a GPU's share), and the deduplicated phases are paced by their
most loaded link — the network phase by the node most often hit (a rail flow into it carries
``max_h P(h hit)`` hidden vectors per source token), the NVLink phase by the GPU most often hit
(``max_g P(g hit)``). The shares scale the hot rank's flat bytes to those::

    network_share = max_h P(h hit) / (n·k·max_g s_g),   nvlink_share = max_g P(g hit) / (k·max_g s_g)

(both reduce to ``D/k`` and ``G/k`` for uniform shares). The hit probabilities use the
routing shares before any capacity limit (dropped copies are not subtracted from them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import comb
from pathlib import Path

from dessim.errors import WorkloadError
from dessim.workload.transformer.spread import Spread, hit_probabilities, solve_limited_weights, solve_weights

__all__ = ["MoERouting", "DISTRIBUTIONS", "read_counts", "SKEWED_ROUTING_APPROXIMATION",
           "UNMATCHED_ROUTING_APPROXIMATION"]

#: Load distributions a workload file can name (``model.routing.distribution``).
DISTRIBUTIONS: tuple[str, ...] = ("uniform", "zipf", "counts")

#: What a run with a skewed distribution and DeepEP's deduplicated all-to-all says in its
#: summary (``approximations``): the routing model behind its distinct targets per token.
SKEWED_ROUTING_APPROXIMATION = (
    "MoE routing (zipf/counts distribution, moe_dispatch deepep): distinct target nodes and "
    "GPUs per token from a maximum-entropy router matched to the per-expert loads (under the "
    "max_nodes limit when one is set; exact for that model, a real router may correlate its "
    "choices), sized for the hottest link")

#: What such a run says in addition when a node-limited router cannot have the loads
#: (:func:`~dessim.workload.transformer.spread.solve_limited_weights` found no weights).
UNMATCHED_ROUTING_APPROXIMATION = (
    "MoE routing (max_nodes with a zipf/counts distribution): no node-limited router found "
    "with these per-expert loads; its weights are matched without the limit, so its loads "
    "differ from the shares the load factor uses")


@dataclass(frozen=True, slots=True)
class MoERouting:
    """The routed load of an MoE model (module docstring)."""

    distribution: str = "uniform"
    exponent: float = 1.0                       #: zipf exponent
    counts: tuple[float, ...] = ()              #: tokens per expert (``counts``)
    capacity_factor: float | None = None        #: None: dropless
    #: node-limited routing: a token's experts on at most this many nodes (None: any node)
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        where = "model routing"
        if self.distribution not in DISTRIBUTIONS:
            raise WorkloadError(f"{where}: distribution={self.distribution!r} is unknown; "
                                f"valid: {', '.join(DISTRIBUTIONS)}")
        if not isinstance(self.exponent, (int, float)) or isinstance(self.exponent, bool) \
                or self.exponent < 0:
            raise WorkloadError(f"{where}: exponent={self.exponent!r} must be a number >= 0")
        if self.distribution == "counts":
            if not self.counts or any(c < 0 for c in self.counts) or sum(self.counts) <= 0:
                raise WorkloadError(f"{where}: distribution 'counts' needs counts: one number "
                                    ">= 0 per expert, not all zero")
        elif self.counts:
            raise WorkloadError(f"{where}: counts are given but distribution is "
                                f"{self.distribution!r}; set distribution: counts")
        cf = self.capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or cf <= 0):
            raise WorkloadError(f"{where}: capacity_factor={cf!r} must be a number > 0 "
                                "(or absent: no token dropping)")
        m = self.max_nodes
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise WorkloadError(f"{where}: max_nodes={m!r} must be a whole number >= 1 "
                                "(or absent: a token's experts on any node)")

    @property
    def balanced(self) -> bool:
        return self.distribution == "uniform" and self.capacity_factor is None

    def shares(self, experts: int) -> list[float]:
        """Fraction of token copies each expert receives (sums to 1)."""
        if self.distribution == "uniform":
            w = [1.0] * experts
        elif self.distribution == "zipf":
            w = [1.0 / (i + 1) ** self.exponent for i in range(experts)]
        else:
            if len(self.counts) != experts:
                raise WorkloadError(f"model routing: {len(self.counts)} counts given for "
                                    f"{experts} experts (one count per expert)")
            w = [float(c) for c in self.counts]
        total = sum(w)
        return [x / total for x in w]

    def _kept(self, experts: int) -> list[float]:
        """Shares after the capacity limit (each expert at most ``C / E``)."""
        shares = self.shares(experts)
        if self.capacity_factor is None:
            return shares
        cap = self.capacity_factor / experts
        return [min(s, cap) for s in shares]

    def dropped_fraction(self, experts: int) -> float:
        """Share of routed token copies dropped by the capacity limit (0 when dropless; never
        below 0 from the rounding of the shares' sum)."""
        if self.capacity_factor is None:
            return 0.0
        return max(0.0, 1.0 - sum(self._kept(experts)))

    def load_factor(self, experts: int, ep: int) -> float:
        """The most loaded EP rank's token copies over the balanced mean ``top_k·T``
        (after dropping). 1.0 for uniform routing."""
        if experts % ep:
            raise WorkloadError(f"model routing: ep={ep} does not divide experts={experts}")
        kept = self._kept(experts)
        local = experts // ep
        per_rank = [sum(kept[r * local:(r + 1) * local]) for r in range(ep)]
        return max(per_rank) * ep

    def describe(self, experts: int, ep: int) -> str:
        """One line for a report: the distribution, the capacity factor, the most loaded EP
        rank's load over the mean (:meth:`load_factor`) and the share of token copies dropped
        (:meth:`dropped_fraction`), which skip their experts and are not in the model FLOPs."""
        dist = {"zipf": f"zipf (exponent {self.exponent:g})",
                "counts": f"counts ({len(self.counts)} experts)"}.get(self.distribution, self.distribution)
        cap = ("dropless" if self.capacity_factor is None
               else f"capacity factor {self.capacity_factor:g}")
        text = (f"{dist}, {cap}: the most loaded EP rank's experts process "
                f"{self.load_factor(experts, ep):.3g} x top_k·T token copies (balanced: 1)")
        dropped = self.dropped_fraction(experts)
        if dropped:
            text += (f", {100 * dropped:.3g}% of token copies dropped (they skip their experts; "
                     "model FLOPs count the kept ones)")
        return text

    def gpu_shares(self, experts: int, gpus: int) -> list[float]:
        """Share of the token copies each of ``gpus`` GPUs receives (experts in contiguous
        blocks, before any capacity limit)."""
        shares, local = self.shares(experts), experts // gpus
        return [sum(shares[g * local:(g + 1) * local]) for g in range(gpus)]

    def spread(self, top_k: int, experts: int, nodes: int, per_node: int = 1) -> Spread:
        """Per-token hit probabilities of each of ``nodes`` nodes and ``nodes·per_node`` GPUs
        (module docstring; closed forms for uniform shares, else
        :func:`dessim.workload.transformer.spread.hit_probabilities`). A WorkloadError if the experts do
        not split evenly over the GPUs or the ``max_nodes`` nodes hold fewer than ``top_k``
        experts."""
        return _spread(self, top_k, experts, nodes, per_node)

    def nodes_per_token(self, top_k: int, experts: int, nodes: int) -> float:
        """Expected number ``D`` of distinct nodes a token's ``top_k`` expert copies go to, with
        ``experts`` spread in equal contiguous blocks over ``nodes`` nodes (module docstring:
        exact; at most ``min(max_nodes, nodes, top_k)``)."""
        return self.spread(top_k, experts, nodes).nodes

    def gpus_per_token(self, top_k: int, experts: int, nodes: int, per_node: int) -> float:
        """Expected number ``G`` of distinct GPUs a token's ``top_k`` expert copies go to,
        ``per_node`` GPUs on each of ``nodes`` nodes (module docstring: exact)."""
        return self.spread(top_k, experts, nodes, per_node).gpus

    def network_share(self, top_k: int, experts: int, nodes: int, per_node: int = 1) -> float:
        """Cross-node bytes of a dispatch that sends each token once per target node (DeepEP)
        over those of a flat all-to-all sending every copy, for the most loaded link (module
        docstring): ``D / top_k`` for uniform shares; 1.0 on one node."""
        if nodes <= 1:
            return 1.0
        if self.distribution == "uniform":
            return self.nodes_per_token(top_k, experts, nodes) / top_k
        hot = max(self.gpu_shares(experts, nodes * per_node))
        return min(1.0, max(self.spread(top_k, experts, nodes, per_node).node_hit)
                   / (per_node * top_k * hot))

    def nvlink_share(self, top_k: int, experts: int, nodes: int, per_node: int) -> float:
        """NVLink bytes of a fan-out that forwards each token once per target GPU (DeepEP)
        over those of one forwarding every copy, for the most loaded link (module docstring):
        ``G / top_k`` for uniform shares; 1.0 with one GPU per node (no NVLink phase)."""
        if per_node <= 1:
            return 1.0
        if self.distribution == "uniform":
            return self.gpus_per_token(top_k, experts, nodes, per_node) / top_k
        hot = max(self.gpu_shares(experts, nodes * per_node))
        return min(1.0, max(self.spread(top_k, experts, nodes, per_node).gpu_hit) / (top_k * hot))


@lru_cache(maxsize=64)
def _spread(routing: MoERouting, top_k: int, experts: int, nodes: int, per_node: int) -> Spread:
    """:meth:`MoERouting.spread`, cached (the generator asks once per EP group)."""
    gpus = nodes * per_node
    if nodes < 1 or per_node < 1 or experts % gpus:
        raise WorkloadError(f"model routing: {experts} experts do not split evenly over "
                            f"{nodes} nodes x {per_node} GPUs of the expert-parallel group")
    per_gpu = experts // gpus
    reach = nodes if routing.max_nodes is None else min(routing.max_nodes, nodes)
    if reach * per_gpu * per_node < top_k:
        raise WorkloadError(f"model routing: max_nodes={routing.max_nodes} nodes hold "
                            f"{reach * per_gpu * per_node} experts ({per_gpu * per_node} per node), "
                            f"fewer than top_k={top_k}")
    if routing.distribution == "uniform":          # the closed forms of the module docstring
        def distinct(blocks: int, size: int) -> float:
            return blocks * (1.0 - comb((blocks - 1) * size, top_k) / comb(blocks * size, top_k))
        d = distinct(reach, per_gpu * per_node)
        g = distinct(reach * per_node, per_gpu)
        return Spread((d / nodes,) * nodes, (g / gpus,) * gpus, d, g)
    shares = routing.shares(experts)
    weights, certain = solve_weights(shares, top_k)
    if reach < nodes:               # the weights under the limit, where a limited router can
        limited = solve_limited_weights(shares, top_k, nodes, reach, (weights, certain))
        if limited is None:
            spread = hit_probabilities(weights, certain, top_k, nodes, per_node, routing.max_nodes)
            return replace(spread, loads_matched=False)
        weights, certain = limited
    return hit_probabilities(weights, certain, top_k, nodes, per_node, routing.max_nodes)


def _at(where: list[str], i: int) -> str:
    return f" ({where[i]})" if where else ""


def read_counts(value: object, what: str) -> tuple[float, ...]:
    """Tokens per expert from a list of numbers or a file path (one number per line, ``#``
    comments); a WorkloadError naming ``what`` otherwise."""
    where: list[str] = []          # per item, where it comes from in a file
    if isinstance(value, str):
        path = Path(value).expanduser()
        if not path.is_file():
            raise WorkloadError(f"{what}: counts file {value!r} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{what}: cannot read counts file {value!r}: {exc}") from None
        items: list[object] = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                items.append(line)
                where.append(f"{value}, line {number}")
        value = items
    if not isinstance(value, (list, tuple)) or not value:
        raise WorkloadError(f"{what}: expected a list of token counts per expert or a file "
                            f"name, got {value!r}")
    out = []
    for i, item in enumerate(value):
        try:
            x = float(item)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise WorkloadError(f"{what}[{i}]{_at(where, i)}: {item!r} is not a number") from None
        if x < 0 or x != x:
            raise WorkloadError(f"{what}[{i}]{_at(where, i)}: {item!r} must be >= 0")
        out.append(x)
    return tuple(out)
