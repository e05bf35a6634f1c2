"""A vLLM P2P peer: vLLM's own session, ZMQ and NIXL code, driven as its tier does.

Run it as ``python -m p2pfsm.tools.vllm_peer server|client ...`` with a Python that has vLLM
0.33.0 or 0.34.0 (``.venv-vllm`` / ``.venv-vllm-0.34``, built by ``.ci/install-vllm.sh
RELEASE``); the interop suite and
``p2pfsm bench --vs-vllm`` start it that way. Besides vLLM it imports only p2pfsm's shared
demo block model (``p2pfsm.demo_blocks``). It drives ``P2PSession`` directly, the way vLLM's
``P2PSecondaryTierManager`` does (``vllm/v1/kv_offload/tiering/p2p/manager.py`` in the wheel):
``poll()`` every iteration, ``add_stored_blocks`` for supply, ``request_blocks`` for
fetches, ``register_lookup`` + ``flush_pending_lookups`` for lookups, and a small
``ParentManager`` stand-in for ``serve_external_requests``.

Two roles:

``server``
    Holds demo blocks ``0..N-1`` at their own index. A fetch that names a request with no
    lookup behind it is supplied at once with the demanded blocks it holds (vLLM's manager
    replays parked stores on ``new_fetch_ids``). Options shape the PD flows:
    ``--hold-back 4,5`` keeps those blocks "not yet stored" for each request until
    ``--late-after`` seconds after the server first saw that request (a lookup sees them
    as HIT_PENDING until then; a waiting fetch is supplied then), so one server serves
    many clients alike; ``--finish-after S`` calls ``finish_request`` on each fetched
    request (whose id starts with ``--finish-prefix``) ``S`` seconds after its fetch.
    Prints one ``ready`` line when it accepts peers, and a ``summary`` line (every control
    frame it saw or sent, per peer, and its store results) when it stops: on SIGTERM or
    SIGINT, or after ``--max-seconds``.

``client``
    Connects to ``--connect HOST:PORT``, fetches ``--keys`` (``pd``: directly; ``sym``:
    lookup first, then fetch the hits, then ``finish_request``), verifies every byte it
    received against the block model, and prints one ``result`` line. ``--load-timeout``
    patches the release's load timeout constants (the capture harness did the same with 3 s).
    With ``--plan FILE`` it waits for that JSON file and runs its steps instead, one
    session each (:func:`~p2pfsm.tools.vllm_peer.plans.run_plan`), switching between vLLM's
    sessions and p2pfsm's per step; ``kill`` steps keep fetches in flight until a process
    is killed (:func:`~p2pfsm.tools.vllm_peer.plans.run_kill`).

Both roles record a :class:`~p2pfsm.tools.vllm_peer.recording.Trace` per session: what a tier
manager sees of it.

``--adapter`` (either role) calls :func:`p2pfsm.vllm.install` first, so the same driver
runs p2pfsm's sessions behind vLLM's interface (``--full``: the full install, p2pfsm's
control and data transports too); the peer builds each session through the
name vLLM's tier manager uses, so it gets whichever class the manager would.

Every line meant for the test starts with ``P2PINTEROP `` followed by one JSON object;
vLLM's own logging goes to stderr. Loopback only; every loop is bounded in time.

Modules, one job each: :mod:`~p2pfsm.tools.vllm_peer.common` (transports, regions, output
lines), :mod:`~p2pfsm.tools.vllm_peer.recording` (what a session sent, received and showed),
:mod:`~p2pfsm.tools.vllm_peer.server`, :mod:`~p2pfsm.tools.vllm_peer.client`,
:mod:`~p2pfsm.tools.vllm_peer.plans` (plans, links, concurrency runs),
:mod:`~p2pfsm.tools.vllm_peer.patches` (the two changes to vLLM the harness makes, applied by
:func:`~p2pfsm.tools.vllm_peer.patches.apply` when the CLI starts and undone by
:func:`~p2pfsm.tools.vllm_peer.patches.undo`) and :mod:`~p2pfsm.tools.vllm_peer.cli`. Importing the
package imports nothing else, and no module patches anything when it is imported.
"""
