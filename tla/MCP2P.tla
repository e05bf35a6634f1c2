------------------------------- MODULE MCP2P -------------------------------
(***************************************************************************)
(* Model-checking bounds for P2P: the scenarios each config runs.          *)
(* A scenario bounds one behaviour: whether it starts with the handshake   *)
(* done, the hosts' workload (loads, store jobs, lookups, finish calls per *)
(* peer), the key sets they use, the role timers that may fire and the     *)
(* kinds of fault that may happen (at most MaxFaults of them).             *)
(* Peer a loads and looks up; peer b supplies and answers (LoadPeers and   *)
(* SupplyPeers in the configs).                                            *)
(***************************************************************************)
EXTENDS P2P

K1 == {{"k1"}}
K12 == {{"k1", "k2"}}
AnyKeys == {{"k1"}, {"k2"}, {"k1", "k2"}}

\* Nothing happens: a base to override.
Quiet == [ready |-> TRUE, loads |-> 0, stores |-> 0, lookups |-> 0,
          fin |-> [p \in {"a", "b"} |-> 0], faults |-> {}, timers |-> {},
          fks |-> K1, lks |-> K1, sks |-> K1]
Fin(a, b) == ("a" :> a @@ "b" :> b)

\* ------------------------------------------------------------------ gate
\* The PR gate: small scenarios whose union reaches every transition two
\* p2pfsm peers can take (tests/conformance/test_models_vs_spec.py).
GateScenarios == <<
    \* 1. handshake from idle, a load and a supply queued behind it, every fault; the
    \*    load's fetch may arrive malformed (a buggy consumer) while the producer still
    \*    awaits its ack or is ready: rejected, and answered transfer_done(false) at once
    [Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1,
                  !.faults = {"incompat", "dup", "regfail", "hstimer", "close", "cut", "drop",
                              "corrupt"}],
    \* 2. PD loads: supply before or after the fetch, finish on both sides, timeouts, a
    \*    close while a failed round drains
    [Quiet EXCEPT !.loads = 1, !.stores = 2, !.fin = Fin(1, 2), !.faults = {"wfail", "close"},
                  !.timers = {"load", "abort_ack", "store", "demand"}],
    \* 3. PD loads under loss, cut and close; a finish forgotten after its lifetime
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.fin = Fin(1, 1),
                  !.faults = {"cut", "close", "drop", "finlife"}, !.timers = {"load", "abort_ack"}],
    \* 4. lookups answered in parts (two pins in one round), unservable fetches
    [Quiet EXCEPT !.loads = 1, !.stores = 2, !.lookups = 1,
                  !.timers = {"lookup_pending", "lookup"}, !.fks = K12, !.lks = K12, !.sks = K12],
    \* 5. lookups with finish on both sides: terminal fetches, closed lookup pins, pins
    \*    that expire before their fetch
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.lookups = 1, !.fin = Fin(1, 2),
                  !.timers = {"lookup", "store"}, !.fks = K12, !.lks = K12],
    \* 6. lookups (and their pins) when the session dies
    [Quiet EXCEPT !.lookups = 1, !.stores = 1, !.fin = Fin(0, 1), !.faults = {"cut", "close"},
                  !.timers = {"lookup"}],
    \* 7. loads and lookups when a frame is lost: aborts and terminal fetches meet rounds
    \*    whose fetch or abort never arrived; a re-sent abort meets a silently draining
    \*    round, a demand deadline a draining one
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.lookups = 1, !.fin = Fin(1, 1),
                  !.faults = {"drop"}, !.timers = {"load", "abort_ack", "demand"}],
    \* 9. as 7, with supply after the round drains silently
    [Quiet EXCEPT !.loads = 1, !.stores = 2, !.lookups = 1, !.fin = Fin(1, 1),
                  !.faults = {"drop"}, !.timers = {"load"}],
    \* 8. a write fails while another of the round is in flight: the round drains, owing
    \*    transfer_done(false), and its demand deadline passes meanwhile
    [Quiet EXCEPT !.loads = 1, !.stores = 2, !.faults = {"wfail"}, !.timers = {"demand"},
                  !.fks = K12, !.sks = {{"k1"}, {"k2"}}],
    \* 10. a peer restarts mid-transfer: its connect, of a new incarnation, ends the
    \*     other's session (every job one result) and no old frame reaches the new one
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"restart"}],
    \* 11. a one-sided loss mid-transfer: one side's transport reports the connection lost,
    \*     the other's does not; the dead session answers its peer's frames (the load's
    \*     abort, re-sent) with a disconnect, rate-limited
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"halfcut"},
                  !.timers = {"load", "abort_ack"}],
    \* 12. the consumer's connect_ack is lost (a routing-id takeover): its first request
    \*     stands for the ack, and the producer's replies go out
    [Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1, !.lookups = 1,
                  !.faults = {"ackloss"}, !.timers = {"load"}],
    \* 13. a producer that splits and coalesces its lookup answers: two lookups of a
    \*     request, keys settled one by one, parts after a lookup's deadline
    [Quiet EXCEPT !.lookups = 2, !.stores = 2, !.faults = {"split"},
                  !.timers = {"lookup", "lookup_pending"}, !.lks = AnyKeys],
    \* 14. the connection is cut mid-transfer: the load's destination is held until the
    \*     data plane proves the producer's writes over (PeerGone), then released
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"cut", "gone"}]
>>

\* ------------------------------------------------------------------ gate, vllm-0.34
\* gate_vllm034.cfg: the profile vllm-0.34 (an aborted load is reported at its abort's
\* sending and its destination released later; a missing abort_ack ends the session; a
\* bounded hold). With the gate (native), these reach every transition of models/ the
\* profiles add (tests/conformance/test_models_vs_spec.py takes the union).
Gate034Scenarios == <<
    \* 1. a load that times out or is finished while its write may land: reported at the
    \*    abort, released by the abort_ack or a racing transfer_done; a missing abort_ack
    \*    ends the session and the held destination waits for a proof or the hold
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.fin = Fin(1, 1),
                  !.timers = {"load", "abort_ack", "hold"}],
    \* 2. the same when the connection is cut or the session closed
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"cut", "close", "gone"},
                  !.timers = {"load", "hold"}],
    \* 3. before the handshake completes: a fetch still queued is retired where it waits
    \*    when its deadline passes or the host finishes its request (never sent, no abort;
    \*    the request's terminal fetch queued, which closes the supply the producer holds
    \*    for it), handed to the transport by the flush, or failed when the session ends
    [Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1, !.fin = Fin(1, 0),
                  !.faults = {"cut"}, !.timers = {"load", "abort_ack"}],
    \* 4. an overdue lookup answer ends the session, before and after the handshake
    \*    completes; the session loss reports the lookup
    [Quiet EXCEPT !.ready = FALSE, !.lookups = 1, !.timers = {"lookup"}],
    \* 5. the host fetches a request whose lookup still waits: the lookup is reported, and
    \*    its late answer absorbed or its second period passes, the session kept
    [Quiet EXCEPT !.lookups = 1, !.loads = 1, !.stores = 1, !.timers = {"lookup"}]
>>

\* ------------------------------------------------------------------ gate, vllm-0.33
\* gate_vllm033.cfg: the profile vllm-0.33. Its ProfileBehaviour is native's but for
\* lookupEnds (an overdue lookup answer ends the session, as vllm-0.34's does); this small
\* gate checks the spec under its own Profile name where a profile matters (a load's
\* deadline, the host's finish, an unanswered abort, the session's loss, an overdue
\* lookup answer, a fetch while a lookup waits), and the spec->code replay of its steps
\* runs with sessions of that profile.
Gate033Scenarios == <<
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.fin = Fin(1, 0), !.faults = {"cut"},
                  !.timers = {"load", "abort_ack"}],
    [Quiet EXCEPT !.ready = FALSE, !.lookups = 1, !.timers = {"lookup"}],
    [Quiet EXCEPT !.lookups = 1, !.loads = 1, !.stores = 1, !.timers = {"lookup"}]
>>

\* ------------------------------------------------------------------ large
\* The gate's scenarios with every role timer armed (large.cfg also allows two faults per
\* behaviour, three rounds and three aborts per request).
AllTimers == TimerKinds
LargeScenarios == [i \in DOMAIN GateScenarios |-> [GateScenarios[i] EXCEPT !.timers = AllTimers]]

\* ------------------------------------------------------------------ liveness
\* Every timer may fire (they are fair), so every job, pin, lookup and abort ends.
LiveScenarios == <<
    [Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1, !.fin = Fin(1, 1),
                  !.timers = AllTimers],
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.lookups = 1, !.fin = Fin(1, 0),
                  !.faults = {"cut", "drop"}, !.timers = AllTimers, !.fks = K12,
                  !.lks = K12, !.sks = K12],
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"halfcut"}, !.timers = AllTimers],
    [Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1, !.faults = {"ackloss"},
                  !.timers = AllTimers]
>>

\* ------------------------------------------------------------------ liveness in CI
\* live_ci.cfg: every eventual property of live.cfg, over smaller scenarios (about a third
\* of live.cfg's states; .ci/run checks it). live.cfg's second scenario (a load, a lookup
\* and a supply of two keys, finish, cut or drop: 159,454 of its 169,716 states) is split
\* by fault and by whether a load takes part; keys are single where two add nothing to
\* liveness, except in the load-free lookup (an answer in parts).
LiveCIScenarios == <<
    \* 1. handshake from idle, a load and a supply, finish on both sides (live.cfg's 1)
    [Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1, !.fin = Fin(1, 1),
                  !.timers = AllTimers],
    \* 2. a load, a lookup and a supply when a frame is lost
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.lookups = 1, !.faults = {"drop"},
                  !.timers = AllTimers],
    \* 3. the same when the connection is cut
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.lookups = 1, !.faults = {"cut"},
                  !.timers = AllTimers],
    \* 4. a lookup of two keys answered in parts, its pins, finish on both sides, under
    \*    loss or cut (no load: the pins end by finish, deadline or death)
    [Quiet EXCEPT !.stores = 1, !.lookups = 1, !.fin = Fin(1, 1), !.faults = {"drop", "cut"},
                  !.timers = AllTimers, !.lks = K12, !.sks = K12],
    \* 5. finish while loading when a frame is lost: the abort or terminal fetch may vanish
    [Quiet EXCEPT !.loads = 1, !.stores = 1, !.fin = Fin(1, 0), !.faults = {"drop"},
                  !.timers = AllTimers],
    \* 6. a one-sided loss mid-transfer (live.cfg's 3)
    LiveScenarios[3],
    \* 7. the consumer's connect_ack lost (live.cfg's 4)
    LiveScenarios[4]
>>

\* ------------------------------------------------------------------ must fail
\* Each re-introduces one vLLM bug (tla/mustfail/*.cfg) with the least work that
\* shows it.

\* P1: round 1's lookup pins into round 0's record while round 0 is served.
MustFailP1 == <<[Quiet EXCEPT !.loads = 1, !.stores = 2, !.lookups = 2]>>
\* P3: finish while loading.
MustFailP3 == <<[Quiet EXCEPT !.loads = 1, !.fin = Fin(1, 0)]>>
\* P4: an abort re-sent, its second abort_ack late; the round number reused at once.
MustFailP4 == <<[Quiet EXCEPT !.loads = 2, !.fin = Fin(1, 0), !.timers = {"load", "abort_ack"}]>>
\* P5: the abort goes unanswered while the write is still in flight.
MustFailP5 == <<[Quiet EXCEPT !.loads = 1, !.stores = 1, !.timers = {"load", "abort_ack"}]>>
\* P10: no deadline on a wait: a load whose producer never supplies, with neither the
\* consumer's load timer nor the producer's demand timer.
\* One-sided loss: one side's session dies of a transport loss the other never sees.
MustFailOneSided == <<[Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"halfcut"},
                                    !.timers = {"load", "abort_ack"}]>>
\* Lost ack: the consumer's connect_ack is lost and the producer waits for it (no
\* handshake deadline here); without the implicit ack the consumer's fetch and aborts are
\* served but every reply stays queued.
MustFailLostAck == <<[Quiet EXCEPT !.ready = FALSE, !.loads = 1, !.stores = 1,
                                   !.faults = {"ackloss"}, !.timers = {"load", "abort_ack"}]>>
\* A held destination released while the write may land: at the abort's sending
\* (vllm-0.34 reports the load then), or at the session's end without proof (native).
MustFailAtSend == <<[Quiet EXCEPT !.loads = 1, !.stores = 1, !.timers = {"load"}]>>
MustFailUnproven == <<[Quiet EXCEPT !.loads = 1, !.stores = 1, !.faults = {"halfcut", "gone"}]>>
MustFailP10 == <<[Quiet EXCEPT !.loads = 1, !.timers = AllTimers \ {"load", "demand"}]>>
=============================================================================
