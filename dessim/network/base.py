"""The :class:`Network` contract that every network model implements.

Collectives and the engine code against exactly this interface: ``transfer()`` returns a simpy
event that succeeds, with the finish time (s) as its value, when the last byte has arrived.

Conventions (dessim's, docs/network.md): sizes in bytes, times in seconds, link
bandwidth per direction; a lone message of ``n`` bytes on a path takes
``sum(link latencies) + n / bottleneck capacity`` where capacity = ``bw * efficiency``.
"""

from __future__ import annotations

import abc
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import simpy

from dessim.errors import NetworkError, TopologyError
from dessim.network.channels import channel_map_for
from dessim.network.families import LaneFamily, QuotientBroken
from dessim.topology.graph import Topology
from dessim.topology.routing import Router, router_for

__all__ = ["BundleTemplate", "FamilyRoute", "Network", "Route", "UtilisationPoint", "NETWORK_MODELS", "make_network",
           "network_model", "register_network", "sparse_bytes"]

#: One change point of a channel's utilisation: (time s, (a, b), used fraction of capacity).
UtilisationPoint = tuple[float, tuple[str, str], float]

#: Routes memoised per network before the memo is cleared (bounded memory).
_MAX_CACHED_ROUTES = 200_000


@dataclass(frozen=True, slots=True)
class Route:
    """A routed path with everything a model needs about it."""

    path: tuple[str, ...]          #: node names, source first
    directions: tuple[int, ...]    #: direction ids of the hops (see :class:`ChannelMap`)
    channels: tuple[int, ...]      #: channel ids loaded, in hop order
    latency: float                 #: sum of the hops' one-way latencies (s)
    bottleneck: float              #: smallest channel capacity on the path (bytes/s)


@dataclass(frozen=True, slots=True)
class FamilyRoute(Route):
    """The route of a lane family's flow (:mod:`dessim.network.families`): the channels and
    directions of every image, image after image (a channel several images cross is listed
    once per image), the representative's path and latency (every image's), the smallest
    bottleneck; ``images`` holds each image's own :class:`Route`, the representative's
    first."""

    images: tuple[Route, ...] = ()
    cut: tuple[int, ...] = ()      #: channels of each image: where ``channels`` splits
    #: channels that several images cross -> how many (None: each is crossed once); such a
    #: channel carries the family's rate that many times
    mult: Any = field(default=None, compare=False, hash=False)


@dataclass(frozen=True, eq=False)
class BundleTemplate:
    """Routes of transfers that a model may carry as ONE flow bundle (see
    :meth:`Network.bundle_template`): key-independent routes with equal latency, either
    pairwise channel-disjoint with equal bottleneck capacity or sharing channels uniformly
    (every member gets the same max-min ``rate`` while the bundle is alone)."""

    routes: tuple[Route, ...]      #: one per member, in member order
    channels: Any                  #: numpy int array: every member's channels (in member order)
    directions: Any                #: numpy int array: every member's directions
    latency: float                 #: s, the same for every member
    bottleneck: float              #: bytes/s, the first member's bottleneck capacity
    rate: float = 0.0              #: bytes/s each member moves at while the bundle runs alone
    #: no direction listed twice in ``directions`` (then ``a[directions] += x`` adds what
    #: ``np.add.at`` would, each direction once)
    distinct_directions: bool = False

    def __len__(self) -> int:
        return len(self.routes)



def sparse_bytes(delta: np.ndarray) -> tuple[list[int], list[float]]:
    """The non-zero entries of a per-direction byte vector: (direction indices, bytes), in
    direction order."""
    idx = np.flatnonzero(delta)
    return idx.tolist(), np.asarray(delta, dtype=float)[idx].tolist()

class Network(abc.ABC):
    """A network model driven by a simpy environment.

    Counters: ``flows_started`` and ``flows_finished`` count transfers (local copies and
    empty messages included), ``solves`` counts rate re-computations, and ``events`` is their
    sum — the model's work, independent of how many simpy events it used internally.
    With ``record_links=True`` the model appends :data:`UtilisationPoint` change points to
    ``utilisation``. ``bundles`` allows the exact flow-bundle shortcut where a model has one
    (:meth:`bundle_template`); ``False`` switches it off.
    """

    #: Registry name of the model.
    name: ClassVar[str] = ""

    def __init__(self, env: simpy.Environment, topology: Topology, *,
                 router: Router | None = None, record_links: bool = False,
                 bundles: bool = True) -> None:
        if not isinstance(topology, Topology):
            raise NetworkError(f"a network needs a dessim Topology, got {type(topology).__name__}")
        self.env = env
        self.topology = topology
        self.router = router if router is not None else router_for(topology)
        self.channels = channel_map_for(topology)
        #: GPU node names by rank (a collective's transfers name ranks: resolved here without
        #: the per-call checks of Topology.resolve, which only out-of-range ranks need)
        self._gpu_names: tuple[str, ...] = topology.gpus
        self.record_links = bool(record_links)
        self.bundles = bool(bundles)
        self.utilisation: list[UtilisationPoint] = []
        #: bytes per direction of finished transfers (subclasses add to it)
        self._done_bytes: list[float] = [0.0] * len(self.channels.directions)
        self.flows_started = 0
        self.flows_finished = 0
        self.solves = 0
        self._routes: dict[tuple[str, str, int], Route] = {}
        #: Routes of pairs whose path no ECMP key can change (see Router.key_independent).
        self._fixed_routes: dict[tuple[str, str], Route] = {}

    @property
    def events(self) -> int:
        """Flow starts + flow finishes + rate solves so far."""
        return self.flows_started + self.flows_finished + self.solves

    # ------------------------------------------------------------------ public
    def transfer(self, src: str | int, dst: str | int, nbytes: float, *, key: int = 0,
                 family: LaneFamily | None = None, latency: float | None = None) -> simpy.Event:
        """Start a transfer now (``env.now``); endpoints are node names or GPU ranks.

        The event succeeds when the last byte arrives; its value is the finish time (s).
        ``nbytes`` must be >= 0 (0 takes the path latency only); ``src == dst`` finishes
        immediately (a local copy uses no link). ``key`` selects among equal-cost paths
        (see :class:`~dessim.topology.routing.Router`). With ``family`` (ranks only) the
        transfer also stands for its images in the family's other lanes
        (:meth:`family_route`); models that cannot certify families refuse them.
        ``latency`` (s; None: the route's): the part of the route's latency still to pay
        before the bytes move, at most the route's (larger values are the route's, negative
        ones 0) — a message on a connection that keeps several in flight, whose latency
        overlapped its predecessor's bytes (:func:`~dessim.collectives.executor.run_schedule`,
        windowed connections).
        """
        gpus = self._gpu_names
        if type(src) is int and type(dst) is int and 0 <= src < len(gpus) and 0 <= dst < len(gpus):
            s, d = gpus[src], gpus[dst]      # ranks: what _endpoint resolves them to
        else:
            s = self._endpoint(src, "source")
            d = self._endpoint(dst, "destination")
        n = self._size(nbytes, s, d)
        if s == d:
            self.flows_started += 1
            self.flows_finished += 1
            done = self.env.event()
            done.succeed(self.env.now)
            return done
        route = self.route(s, d, key) if family is None else self.family_route(src, dst, key, family)
        self.flows_started += 1
        return self._start(route, float(n), remaining_latency(route.latency, latency))

    #: Whether this model certifies lane families (:mod:`dessim.network.families`) at every
    #: rate solve; :meth:`family_route` refuses them otherwise.
    certifies_families: ClassVar[bool] = False

    def use_channel_quotient(self) -> bool:
        """Share bandwidth on blocks of channels that no route tells apart instead of on
        every channel (:mod:`dessim.network.quotient`; exact), if this model can; returns
        whether it does. Models without shared channels cannot (the default)."""
        return False

    def family_route(self, src: int, dst: int, key: int, family: LaneFamily) -> FamilyRoute:
        """The route of ``src -> dst`` (GPU ranks, not a local copy) standing for its images
        in ``family``: every image's channels (each image with its own ECMP key; a channel
        that ``m`` images cross is listed ``m`` times). Raises
        :class:`~dessim.network.families.QuotientBroken` unless every image has the
        representative's latency and one path only (no ECMP choice: hashed paths make lanes
        collide on some links and not on others, which the certificate would reject after
        the fact)."""
        if not self.certifies_families:
            raise QuotientBroken(f"the {self.name!r} network model does not certify lane families")
        memo = (src, dst, key, family)
        found = self._routes.get(memo)
        if found is not None:
            return found  # type: ignore[return-value]
        for r in (src, dst):
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                raise NetworkError(f"lane family: endpoint {r!r} is not a GPU rank")
        es, ed = self._endpoint(src, "source"), self._endpoint(dst, "destination")
        independent = self.router.key_independent
        if not independent(es, ed):
            # hashed onto one of several equal-cost paths: the lanes would collide on some
            # links and not on others, so the certificate would fail and force a replay
            raise QuotientBroken(f"transfer {src} -> {dst} takes one of several equal-cost "
                                 "paths (ECMP): its lane images may collide differently")
        base = self.route(es, ed, key)
        routes = [base]
        for a, b, k in family.images(src, dst, key):
            ea, eb = self._endpoint(a, "source"), self._endpoint(b, "destination")
            if ea != eb and not independent(ea, eb):
                raise QuotientBroken(f"transfer {src} -> {dst}: its image {a} -> {b} takes one "
                                     "of several equal-cost paths (ECMP)")
            image = None if ea == eb else self.route(ea, eb, k)
            if image is None or image.latency != base.latency:
                raise QuotientBroken(f"transfer {src} -> {dst}: its image {a} -> {b} "
                                     + ("is a local copy" if image is None else
                                        f"has latency {image.latency:.6g} s, not {base.latency:.6g} s"))
            routes.append(image)
        chans = tuple(c for r in routes for c in r.channels)
        mult = ({c: k for c, k in Counter(chans).items() if k > 1}
                if len(set(chans)) != len(chans) else None)
        found = FamilyRoute(base.path, tuple(x for r in routes for x in r.directions), chans,
                            base.latency, min(r.bottleneck for r in routes), tuple(routes),
                            tuple(len(r.channels) for r in routes), mult)
        if len(self._routes) >= _MAX_CACHED_ROUTES:
            self._routes.clear()
        self._routes[memo] = found  # type: ignore[index]
        return found

    def family_routes(self, sources: Sequence[int], destinations: Sequence[int],
                      key: int | Sequence[int], family: LaneFamily,
                      fixed: bool = False) -> list[FamilyRoute | None] | None:
        """:meth:`family_route` of each transfer ``sources[i] -> destinations[i]`` (None for
        a local copy). With ``fixed`` (bundle templates): None instead of a local copy or of
        a refused family (family routes never depend on the ECMP key: ECMP is refused)."""
        keys = [key] * len(sources) if isinstance(key, (int, np.integer)) else list(key)
        out: list[FamilyRoute | None] = []
        for s, d, k in zip(sources, destinations, keys):
            if self._endpoint(s, "source") == self._endpoint(d, "destination"):
                if fixed:
                    return None
                out.append(None)
                continue
            try:
                out.append(self.family_route(s, d, k, family))
            except QuotientBroken:
                if fixed:
                    return None
                raise
        return out

    def route(self, src: str, dst: str, key: int = 0) -> Route:
        """The :class:`Route` a transfer from ``src`` to ``dst`` (node names) takes."""
        found = self._fixed_routes.get((src, dst))
        if found is not None:
            return found
        memo = (src, dst, key)
        found = self._routes.get(memo)
        if found is not None:
            return found
        try:
            path = self.router.path(src, dst, key)
        except TopologyError as exc:
            raise NetworkError(f"transfer {src!r} -> {dst!r}: {exc}") from None
        fixed = self.router.key_independent(src, dst)
        chmap = self.channels
        dirs = chmap.path_directions(path)
        chans = tuple(chmap.channel_of_direction[i] for i in dirs)
        latency = 0.0
        for i in dirs:
            latency += chmap.direction_latency[i]
        bottleneck = min((chmap.capacity[c] for c in chans), default=math.inf)
        found = Route(path, dirs, chans, latency, bottleneck)
        cache = self._fixed_routes if fixed else self._routes
        if len(cache) >= _MAX_CACHED_ROUTES:
            cache.clear()
        if fixed:
            self._fixed_routes[src, dst] = found
        else:
            self._routes[memo] = found
        return found

    def bundle_template(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                        family: LaneFamily | None = None) -> BundleTemplate | None:
        """A :class:`BundleTemplate` for transfers ``sources[i] -> destinations[i]`` if this
        model can carry them as one exact bundle, else None (always None here: models without
        bundles simply start the transfers one by one)."""
        return None

    def fixed_routes(self, sources: Sequence[str | int],
                     destinations: Sequence[str | int]) -> list[Route] | None:
        """The routes of ``sources[i] -> destinations[i]`` if none is a local copy and each
        is key-independent (the same for every ECMP key), else None. For bundle templates."""
        routes = []
        for s, d in zip(sources, destinations):
            s, d = self._endpoint(s, "source"), self._endpoint(d, "destination")
            if s == d or not self.router.key_independent(s, d):
                return None
            routes.append(self.route(s, d))
        return routes

    def keyed_routes(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                     key: int | Sequence[int] = 0) -> list[Route | None]:
        """The route each transfer ``sources[i] -> destinations[i]`` takes with ECMP ``key``
        (one for all, or one per transfer); None for a local copy. For bundle groups."""
        keys = [key] * len(sources) if isinstance(key, int) else list(key)
        routes: list[Route | None] = []
        for s, d, k in zip(sources, destinations, keys):
            s, d = self._endpoint(s, "source"), self._endpoint(d, "destination")
            routes.append(None if s == d else self.route(s, d, k))
        return routes

    def bundle_groups(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                      key: int | Sequence[int] = 0, *, cache: bool = True,
                      family: LaneFamily | None = None
                      ) -> tuple[tuple[BundleTemplate | None, tuple[int, ...]], ...] | None:
        """The transfers ``sources[i] -> destinations[i]`` (ECMP ``key``: one for all, or one
        per transfer) split into groups that can each travel as one exact bundle (template
        None: ordinary flows); None when this model has no bundles (always here). A model may
        cache the answer per pair list; ``cache=False`` says the list is a one-off."""
        return None

    def coupled_route(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                      key: int = 0) -> Route | None:
        """ONE route over every connection ``sources[i] -> destinations[i]`` (ECMP ``key``),
        for connections that move data at one common rate — a pipelined ring, whose
        flow-controlled connections all run at the pace of the slowest (see
        :func:`~dessim.collectives.executor.run_schedule`, ``stream_rings``).

        Its channels are all the connections' channels, so a model shares each of them
        between the coupled flow and the other traffic exactly as it would share it with one
        connection; its latency is the largest connection latency (s), its bottleneck the
        smallest capacity (bytes/s). None when a connection is a local copy or two
        connections load the same channel (a coupled flow crosses each channel once)."""
        routes = self.keyed_routes(sources, destinations, key)
        if not routes or any(r is None for r in routes):
            return None
        chans = tuple(c for r in routes for c in r.channels)  # type: ignore[union-attr]
        if len(set(chans)) != len(chans):
            return None
        return Route((), tuple(d for r in routes for d in r.directions), chans,  # type: ignore[union-attr]
                     max(r.latency for r in routes), min(r.bottleneck for r in routes))  # type: ignore[union-attr]

    def transfer_on(self, route: Route, nbytes: float) -> simpy.Event:
        """Start ``nbytes`` on ``route`` now (e.g. a :meth:`coupled_route`): the
        :meth:`transfer` semantics on a given route."""
        n = self._size(nbytes, "route", f"{len(route.channels)} channels")
        self.flows_started += 1
        return self._start(route, float(n), route.latency)

    def start_bundle(self, template: BundleTemplate, nbytes: float,
                     on_done: Callable[[Sequence[int]], None], *,
                     latency: float | None = None) -> None:
        """Start ``nbytes`` on every member route of ``template`` now; ``on_done(members)``
        is called (from a simpy callback) with the member indices that finish, at their
        finish time: all at once while the bundle holds, one by one after it splits.
        ``latency``: the part of the members' route latency still to pay, as in
        :meth:`transfer` (None: all of it)."""
        raise NotImplementedError(f"{type(self).__name__} has no flow bundles")

    @abc.abstractmethod
    def link_bytes(self) -> dict[tuple[str, str], float]:
        """Bytes carried so far per direction ``(a, b)`` of every link (0.0 if unused)."""

    def finished_bytes(self) -> np.ndarray:
        """Bytes per direction of the transfers finished so far (a copy; the order of
        ``channels.directions``). With :meth:`add_finished_bytes`, lets the engine replay a
        memoised collective's traffic without moving it (``dessim.engine``)."""
        return np.asarray(self._done_bytes, dtype=float)

    def add_finished_bytes(self, delta: np.ndarray | tuple[list[int], list[float]]) -> None:
        """Count ``delta`` bytes per direction as carried (see :meth:`finished_bytes`):
        a vector in the order of ``channels.directions``, or its sparse form
        :func:`sparse_bytes` (what a caller that adds the same traffic again keeps)."""
        done = self._done_bytes
        directions, nbytes = delta if isinstance(delta, tuple) else sparse_bytes(delta)
        for d, v in zip(directions, nbytes):     # plain float additions, in direction order
            done[d] += v

    # ------------------------------------------------------------------ for subclasses
    @abc.abstractmethod
    def _start(self, route: Route, nbytes: float, latency: float) -> simpy.Event:
        """Start a validated transfer of ``nbytes >= 0`` bytes along ``route`` now, paying
        ``latency`` seconds (``route.latency`` or less, :meth:`transfer`) before the bytes move."""

    def _bytes_by_direction(self, per_direction: list[float]) -> dict[tuple[str, str], float]:
        return dict(zip(self.channels.directions, per_direction))

    # ------------------------------------------------------------------ validation
    def _endpoint(self, endpoint: Any, role: str) -> str:
        try:
            return self.topology.resolve(endpoint)
        except TopologyError as exc:
            raise NetworkError(f"transfer {role}: {exc}") from None

    @staticmethod
    def _size(nbytes: Any, src: str, dst: str) -> float:
        if type(nbytes) is float and 0.0 <= nbytes < math.inf:   # the common case, at once
            return nbytes
        ok = (isinstance(nbytes, (int, float)) and not isinstance(nbytes, bool)
              and math.isfinite(nbytes) and nbytes >= 0)
        if not ok:
            raise NetworkError(f"transfer {src!r} -> {dst!r}: size {nbytes!r} must be a finite "
                               "number of bytes >= 0")
        return nbytes


#: Network models by name (filled by the model modules through :func:`register_network`).
NETWORK_MODELS: dict[str, type[Network]] = {}


def register_network(cls: type[Network]) -> type[Network]:
    """Class decorator: add a model to :data:`NETWORK_MODELS` under ``cls.name``."""
    NETWORK_MODELS[cls.name] = cls
    return cls


def network_model(model: "str | type[Network]") -> type[Network]:
    """The network model class of ``model``: a name in :data:`NETWORK_MODELS` or a
    :class:`Network` subclass itself (a strategy object, as networkx takes ``flow_func``)."""
    if isinstance(model, type) and issubclass(model, Network):
        return model
    cls = NETWORK_MODELS.get(model) if isinstance(model, str) else None
    if cls is None:
        raise NetworkError(f"unknown network model {model!r}; valid models: "
                           f"{', '.join(sorted(NETWORK_MODELS))} or a Network subclass")
    return cls


def make_network(model: "str | type[Network]", env: simpy.Environment, topology: Topology,
                 **options: Any) -> Network:
    """Instantiate the network model ``model`` (a name in :data:`NETWORK_MODELS` or a
    :class:`Network` subclass)."""
    cls = network_model(model)
    try:
        return cls(env, topology, **options)
    except TypeError as exc:  # an option the model does not take
        raise NetworkError(f"network model {cls.name!r}: {exc}") from None


def remaining_latency(route_latency: float, latency: float | None) -> float:
    """The route latency a transfer still pays (s): all of it (``latency`` None), else
    ``latency`` clamped to ``[0, route_latency]`` (:meth:`Network.transfer`)."""
    return route_latency if latency is None else min(max(float(latency), 0.0), route_latency)
