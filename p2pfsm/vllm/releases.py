"""The vLLM releases the drop-in knows, and how their P2P tiers differ: one table.

The wire is the same in every release here; what differs is the tier's behaviour and the
surface its manager calls. Each :class:`Release` says, as data, what the adapter
(:mod:`p2pfsm.vllm.session`, :mod:`p2pfsm.vllm.data`) and the peer harness do for that
release; no other module compares version strings. :func:`installed` picks the entry of
the vLLM installed (read from its package metadata, without importing vLLM) and refuses
a release not listed here with one line naming the ones that are.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from p2pfsm.errors import ConfigError
from p2pfsm.fsm.profiles import AbortAckTimeout, LostLoad, ReportFailedLoad
from p2pfsm.fsm.profiles import profile as profile_named


@dataclass(frozen=True, slots=True)
class Release:
    """One vLLM release's P2P tier, as the adapter must mirror it.

    Attributes:
        version: the package version, e.g. ``"0.34.0"``.
        profile: the behaviour profile's name (``p2pfsm conform --profile``).
        pd_load_timeout: the client module constant of a PD fetch's load timeout.
        p2p_load_timeout: the constant of a fetch of an id that ran lookups (the same
            constant as ``pd_load_timeout`` where the release has one load timeout).
        stall_timeout_env: the ``vllm.envs`` name of vLLM's setting of the producer's
            transfer stall deadline (seconds, <= 0 disables), or None where the release
            has none; its default is the profile's ``stall``.
        retains_transfers: close() leaves writes the transport has not stopped running,
            returned as ``retained`` (their store jobs stay pinned); otherwise close()
            waits for them a bounded time and then fails their jobs.
        close_releases_destinations: close() is the release point of every load
            reported failed whose destination the peer could still write (vLLM's rule).
        registration_fault: a failed registration of the peer's memory is reported as the
            session's ``data_plane_fault`` (``peer registration failed: ...``), so the
            manager counts it and backs off before it reconnects.

    When a failed load is reported and what a missing abort_ack does are the profile's
    (``models/profiles/``): :attr:`early_load_failure` and
    :attr:`abort_ack_timeout_ends_session` read it, the session machines act on it; how
    a session's end looks to the manager is its ``[executor]`` table
    (:attr:`lost_loads_at_close`, :attr:`buffered_terminals`), which the adapter acts on.
    """

    version: str
    profile: str
    pd_load_timeout: str
    p2p_load_timeout: str
    stall_timeout_env: str | None
    retains_transfers: bool
    close_releases_destinations: bool
    registration_fault: bool

    @property
    def early_load_failure(self) -> bool:
        """A load is reported failed when its abort is sent (vLLM's ``LoadResult`` then
        carries a ``deferred_release`` event, set once its destination is free)."""
        behaviour = profile_named(self.profile).behaviour
        return behaviour.report_failed_load is ReportFailedLoad.AT_ABORT_SEND

    @property
    def abort_ack_timeout_ends_session(self) -> bool:
        """An abort_ack missing past its deadline ends the peer session."""
        behaviour = profile_named(self.profile).behaviour
        return behaviour.abort_ack_timeout is AbortAckTimeout.END_SESSION

    @property
    def lost_loads_at_close(self) -> bool:
        """A load whose session ended under it comes back from close() (``failed_jobs``,
        ``failed_req_ids``), not from a poll."""
        return profile_named(self.profile).executor.lost_load is LostLoad.AT_CLOSE

    @property
    def buffered_terminals(self) -> bool:
        """A transfer_done or abort_ack received in the poll that saw the peer's
        disconnect or the connection's loss still settles its load."""
        return profile_named(self.profile).executor.buffered_terminals


RELEASES: dict[str, Release] = {
    "0.33.0": Release(
        version="0.33.0", profile="vllm-0.33",
        pd_load_timeout="_LOAD_TIMEOUT_S", p2p_load_timeout="_LOAD_TIMEOUT_S",
        stall_timeout_env=None, retains_transfers=False, close_releases_destinations=False,
        registration_fault=False),
    "0.34.0": Release(
        version="0.34.0", profile="vllm-0.34",
        pd_load_timeout="_PD_LOAD_TIMEOUT_S", p2p_load_timeout="_P2P_LOAD_TIMEOUT_S",
        stall_timeout_env="VLLM_P2P_TRANSFER_STALL_TIMEOUT_S", retains_transfers=True,
        close_releases_destinations=True, registration_fault=True),
}
"""Every release the drop-in supports, by version."""

SUPPORTED = tuple(RELEASES)
PROFILES = {r.profile: r for r in RELEASES.values()}
"""The releases by behaviour profile name."""


class UnsupportedVllm(ConfigError):
    """The installed vLLM is missing, or a release the drop-in was not taught."""


def release(version: str) -> Release:
    """The table's entry for ``version`` (a local suffix such as ``+cu129`` ignored)."""
    found = RELEASES.get(version.split("+", 1)[0])
    if found is None:
        raise UnsupportedVllm(f"p2pfsm.vllm supports vLLM {', '.join(SUPPORTED)}; "
                              f"the installed vLLM is {version}")
    return found


def installed() -> Release:
    """The entry of the vLLM installed here; UnsupportedVllm when it is absent or unknown."""
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        raise UnsupportedVllm(f"vLLM is not installed: p2pfsm.vllm needs vLLM "
                              f"{' or '.join(SUPPORTED)} (pip install 'p2pfsm[vllm]')") from None
    return release(version)
