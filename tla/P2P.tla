-------------------------------- MODULE P2P --------------------------------
(***************************************************************************)
(* The P2P KV-cache block protocol of p2pfsm (vLLM 0.33.0 wire protocol)   *)
(* between two peers, each running one session with both roles.           *)
(*                                                                         *)
(* Theory of operation. Every machine state is the very string literal of  *)
(* models/*.toml. Every disjunct of Next is a named operator whose name is *)
(* PascalCase(machine) ++ PascalCase(trigger) of the step it starts (for   *)
(* example ClientRoundRecvTransferDone), or an environment step named      *)
(* Network* (named in p2pfsm.tools.verify.names). An action is one call of *)
(* Session.handle in p2pfsm/session/core.py and takes, atomically, every   *)
(* machine step that call takes: a frame fires the session gate, the round *)
(* step and the round's settle; a death fires session_lost everywhere      *)
(* (session_lost_unsent on the client's machines before ready).            *)
(* The auxiliary variable `fired` holds the (machine, trigger, source,     *)
(* dest) steps of the last action, so that the reachable graph can be      *)
(* projected onto each machine and compared with models/                   *)
(* (tests/conformance/test_models_vs_spec.py).                             *)
(*                                                                         *)
(* Each action reads the acting peer's variables into a record L (Load),   *)
(* threads it through pure helpers that mirror the Python actions, and     *)
(* writes it back (Commit). Peers never touch each other's variables; they *)
(* talk only through the two FIFO channels (module Channel).               *)
(*                                                                         *)
(* Abstractions. Keys are names; a destination is the load job that owns   *)
(* it (a fetch's block indexes name exactly that job's blocks); a write    *)
(* carries the store jobs whose pins it reads. A write may land until it   *)
(* completes, so "in flight" means "may still land". Timers are enabled    *)
(* while armed; there is no clock. Frames carry two ghost fields the       *)
(* protocol never reads: dst (the load job a fetch or abort was sent for,  *)
(* echoed by the reply) and g (the sender was allowed to put it on the     *)
(* wire). Open rounds live in maps whose domain is the open keys.          *)
(*                                                                         *)
(* Bounds. A behaviour runs one scenario (Scenarios[scn], chosen at Init): *)
(* how many loads, store jobs, lookups and finish calls the hosts make,    *)
(* which key sets they use, and which kinds of fault may happen (at most   *)
(* MaxFaults in all). Scenarios add up instead of multiplying, which keeps *)
(* the gate small while every transition is still reached.                *)
(*                                                                         *)
(* Bug switches (tla/mustfail/*.cfg) re-introduce vLLM bugs P1, P3, P4 and *)
(* P5 (each cfg names the vLLM issue or PR it comes from); BugSilentLoss   *)
(* brings back p2pfsm's own design before one-sided losses were modelled;  *)
(* BugReleaseEarly releases a held destination without proof.              *)
(*                                                                         *)
(* Profiles. The constant Profile names a behaviour profile of             *)
(* models/profiles/; ProfileBehaviour (MachineTables, generated from those *)
(* files) says what it changes: atSend (an aborted load is reported when   *)
(* its abort is sent, its destination held until the abort_ack or a racing *)
(* transfer_done), ackEnds (a missing abort_ack ends the whole session),   *)
(* hold (a held destination may be released by the host's bounded hold),   *)
(* lookupEnds (an overdue lookup answer ends the whole session), retire   *)
(* (a fetch still queued behind the handshake whose deadline passes or     *)
(* whose request is finished is retired where it waits: never sent, no     *)
(* abort, the request's terminal fetch queued instead, and a terminal      *)
(* fetch is dropped while a load or lookup of its request is open).        *)
(* A result with released=False ("orphan") is followed by one release      *)
(* ("freed"), a step of its round: every invariant, NoFreeWhileWriteInv    *)
(* first, holds for each profile.                                          *)
(***************************************************************************)
EXTENDS Naturals, Integers, Sequences, FiniteSets, TLC, Channel, MachineTables

CONSTANTS
    Peers,          \* the two node names
    Reqs,           \* kv_request_ids the hosts use
    MaxRounds,      \* round numbers 0 .. MaxRounds-1 per (peer, request)
    MaxAborts,      \* abort_fetch/abort_ack frames of one round in flight (bounds re-sends)
    MaxFaults,      \* faults in one behaviour
    LoadPeers,      \* peers whose host fetches and looks up
    SupplyPeers,    \* peers whose host supplies stored blocks
    DupTypes,       \* frame types the network may duplicate
    Scenarios,      \* sequence of host workloads (see ScenarioType)
    BugP1,          \* server round state keyed by kv_request_id only
    BugP3,          \* host finish drops a load without a result
    BugP4,          \* round numbers restart once a request's client state is pruned
    BugP5,          \* an unanswered abort is given up and the destination freed
    BugSilentLoss,  \* a dead session ignores its peer's frames (the design before issue 11)
    BugNoImplicitAck, \* a request in awaiting_ack does not stand for the peer's lost ack
    BugReleaseEarly, \* a held destination is released while a write may land (at abort
                     \* send, or at the session's end without proof)
    Profile,        \* the behaviour profile (models/profiles/) the sessions run
    TrackFired,     \* record `fired` (off: a smaller state space)
    TrackAct        \* record `act` (liveness: fairness is checked on it)

\* Fault kinds a scenario may allow.
FaultKinds == {"cut", "drop", "dup", "close", "regfail", "hstimer", "incompat", "wfail",
               "restart", "halfcut", "corrupt", "ackloss", "finlife", "split", "gone"}
\* "finlife" is no fault and is not counted against MaxFaults: where a scenario lists it,
\* the host's finish of a request, and the peer's (its terminal fetch), may be forgotten
\* after a frame lifetime (NetworkFrameLifetime), as Session._finished and
\* Session._peer_finished forget them.
\* "split" is no fault either: where a scenario lists it, the producer may split and
\* coalesce its lookup answers, as the protocol allows (SettleLookups).
\* "gone" is no fault either: where a scenario lists it, the executor may tell a session
\* that is over that the peer's writes are over (ClientRoundPeerGone, PeerGone).
\* Role timers a scenario lets fire (the handshake timer is the fault "hstimer").
TimerKinds == {"load", "abort_ack", "lookup", "store", "lookup_pending", "demand", "hold"}

\* ready: the behaviour starts with the handshake done (both sessions ready).
ScenarioType ==
    [ready : BOOLEAN, loads : Nat, stores : Nat, lookups : Nat, fin : [Peers -> Nat],
     faults : SUBSET FaultKinds, timers : SUBSET TimerKinds, fks : SUBSET SUBSET STRING,
     lks : SUBSET SUBSET STRING, sks : SUBSET SUBSET STRING]

ASSUME Cardinality(Peers) = 2 /\ LoadPeers \subseteq Peers /\ SupplyPeers \subseteq Peers
ASSUME MaxRounds \in Nat \ {0} /\ MaxAborts \in Nat \ {0} /\ MaxFaults \in Nat
ASSUME \A i \in DOMAIN Scenarios : Scenarios[i] \in ScenarioType
ASSUME Profile \in ProfileNames

\* What the profile changes (ProfileBehaviour: atSend, ackEnds, hold, lookupEnds).
PB == ProfileBehaviour[Profile]

-----------------------------------------------------------------------------
(* Vocabulary *)

Other(p) == CHOOSE q \in Peers : q # p
Seqs == 0 .. MaxRounds - 1          \* round numbers on the wire
Unbound == -1                       \* round_seq None: supply no fetch has named yet
SSeqs == {Unbound} \cup Seqs
CKeys == Reqs \X Seqs               \* client rounds: (kv_request_id, round_seq)
SKeys == Reqs \X SSeqs              \* server rounds, unbound ones included
NoReq == "-"

Live == {"connecting", "registering", "registering_acked", "awaiting_ack", "ready"}
PreReady == {"connecting", "registering", "registering_acked", "awaiting_ack"}
Handshake == {"connect", "connect_ack", "disconnect"}
\* Ended sessions: "dead" when the peer may still hold the session live (it answers the
\* peer's frames, and closing it sends a disconnect), "ended" when the peer knows.
Ended == {"dead", "ended"}
SessionStates == {"idle", "closed"} \cup Ended \cup Live
\* "bad_fetch": a fetch the network (standing for a buggy consumer) made malformed while
\* it still names its round (NetworkCorrupt): it fails validation, and names req and seq.
\* A fetch naming one destination twice (two blocks cannot land in one) is such a fetch:
\* the session refuses it before any round takes it (models/session.toml recv_bad_fetch).
MsgTypes == Handshake \cup {"fetch", "lookup", "abort_fetch", "transfer_done",
                            "abort_ack", "lookup_resp", "bad_fetch"}
\* Resting states. "new" is never observed between actions (a host call or frame
\* creates an instance and fires its first trigger at once), "done", "aborted", "released",
\* "answered", "discarded", "cancelled" and "dropped" end the instance. A round in
\* "reported" or "orphaned" has its result (released=False) and holds its destination.
CRStates == {"queued", "loading", "aborting", "reported", "orphaned"}
\* Client round states whose load the peer may still serve (models: the set `live`).
LiveCR == {"queued", "loading"}
Holding == {"reported", "orphaned"}
CLStates == {"probing", "expired"}
\* A draining serve round is in the state named by the reply it owes.
Draining == {"draining_abort", "draining_failed", "draining_silent"}
SRStates == {"supplied", "supply_closed", "pinned", "pinned_closed", "serving", "finishing"}
            \cup Draining
\* "orphan": failed, destination held (released=False); "freed": then released;
\* "lost": the peer's own process died with the job (nothing is owed to it).
LoadResults == {"pending", "ok", "fail", "orphan", "freed", "lost", "twice"}
StoreStates == {"pinned", "released", "twice"}

Max(S) == CHOOSE x \in S : \A y \in S : y <= x
Min(S) == CHOOSE x \in S : \A y \in S : x <= y

\* Maps with a dynamic domain.
MapPut(f, k, v) == [x \in DOMAIN f \cup {k} |-> IF x = k THEN v ELSE f[x]]
MapDel(f, k) == [x \in DOMAIN f \ {k} |-> f[x]]
\* A sequence without its i-th element.
Without(s, i) == [x \in 1 .. Len(s) - 1 |-> IF x < i THEN s[x] ELSE s[x + 1]]

\* A frame: <<type, kv_request_id, round_seq, keys, dst, ok, hits, g>>, a tuple to keep
\* dumped states short. Unused fields keep their defaults (every frame has one shape).
Msg(t, req, seq, keys, dst, ok, hits) == <<t, req, seq, keys, dst, ok, hits, TRUE>>
\* The same frame with named fields.
AsRec(f) == [t |-> f[1], req |-> f[2], seq |-> f[3], keys |-> f[4], dst |-> f[5],
             ok |-> f[6], hits |-> f[7], g |-> f[8]]
Ctl(t) == Msg(t, NoReq, Unbound, {}, 0, FALSE, {})
\* A connect carries the sender's incarnation in the dst slot: 0 for the first process
\* of a peer, 1 for the one that replaced it (NetworkRestart; at most one a behaviour).
Restarted == 1

\* A fresh serve round (ServerRound.__init__). lsup: its origin is lookup pins (fixed
\* when the round is created; host supply is never routed to it). dtm: its demand timer
\* is armed (the fetch arms it once, firing consumes it; found by the spec -> code
\* replay, which could not make the code fire it twice). Every other piece of control
\* state is the round's machine state `st`.
NewSR(seq, ord) ==
    [st |-> "new", seq |-> seq, ord |-> ord, supply |-> {}, demand |-> {}, dst |-> 0,
     jobs |-> {}, lsup |-> FALSE, dtm |-> FALSE]

\* Where the producer keeps a round. BugP1: by kv_request_id only (vLLM G3).
SKey(req, seq) == IF BugP1 /\ seq # Unbound THEN <<req, 0>> ELSE <<req, seq>>

-----------------------------------------------------------------------------
(* State *)

VARIABLES
    scn,     \* the scenario of this behaviour (an index of Scenarios)
    sess,    \* [Peers -> SessionStates]: the session machine
    reg,     \* [Peers -> BOOLEAN]: ghost, we have registered the peer's memory
    queue,   \* [Peers -> Seq(frame)]: frames held back until the session is ready
    chan,    \* [Peers -> Seq(frame)]: chan[p] carries frames from p to Other(p)
    cut,     \* BOOLEAN: the connection has been cut
    lost,    \* SUBSET Peers: peers whose transport reported the connection lost while
             \* it still carries frames both ways (a one-sided loss, NetworkHalfCut)
    faults,  \* Nat: faults so far
    compat,  \* BOOLEAN: block_len, hash_seed, fingerprints and layouts agree
    cr,      \* [Peers -> [open CKeys -> client round]]: load rounds (consumer role)
    fl,      \* [Peers -> [Reqs -> Nat]]: round floor, tombstone of rounds ended by an abort
    xl,      \* [Peers -> [Reqs -> SSeqs]]: tombstone of a lookup round whose pins expired
    lr,      \* [Peers -> [Reqs -> SSeqs]]: the round opened by lookups, not fetched yet
    cl,      \* [Peers -> [Reqs -> Seq(client lookup)]]: open lookups, oldest first
    nlk,     \* [Peers -> Nat]: lookups the host asked for
    nlr,     \* [Peers -> Nat]: lookup results reported to the host
    nfin,    \* [Peers -> Nat]: host finish calls
    fin,     \* [Peers -> SUBSET Reqs]: requests the host finished (it supplies them no more:
             \* the session refuses that supply, LocalProtocolError), each forgotten
             \* after a frame lifetime (Session._finished, NetworkFrameLifetime)
    pf,      \* [Peers -> SUBSET Reqs]: requests the peer finished (its terminal fetch) and
             \* named no round of since (a fetch or lookup): a supply that would open a new
             \* round of one is refused at once; forgotten after a frame lifetime
             \* (Session._peer_finished, NetworkFrameLifetime)
    sr,      \* [Peers -> [open SKeys -> serve round]]: serve rounds (producer role)
    sl,      \* [Peers -> [Reqs -> Seq(served lookup)]]: served lookups, arrival order
    wr,      \* [Peers -> SUBSET write]: writes p started that have not completed
    lres,    \* [Peers -> Seq(load result)]: one entry per load job (index = job id)
    sres,    \* [Peers -> Seq(store job)]: one entry per store job (index = job id)
    perr,    \* BOOLEAN: ghost, a frame of a conformant peer was rejected
    gone,    \* SUBSET Peers: peers whose connection leads to a process that restarted
             \* (what they send is lost: it never reaches the new incarnation)
    fired,   \* SUBSET <<machine, trigger, source, dest>>: steps of the last action
    act      \* <<action, peer>>: the last action (when TrackAct), for cheap fairness

peerVars == <<sess, reg, queue, cr, fl, xl, lr, cl, nlk, nlr, nfin, fin, pf, sr, sl, wr,
             lres, sres>>
netVars == <<chan, cut, lost, faults, compat>>
vars == <<scn, peerVars, netVars, gone, perr, fired, act>>

S == Scenarios[scn]

-----------------------------------------------------------------------------
(* Type invariant *)

Frame == MsgTypes \X (Reqs \cup {NoReq}) \X SSeqs \X (SUBSET STRING) \X Nat \X BOOLEAN
         \X (SUBSET STRING) \X BOOLEAN
CRound == [st : CRStates, job : Nat]
CLookup == [st : CLStates, seq : Seqs, keys : SUBSET STRING, got : SUBSET STRING]
SRound == [st : SRStates, seq : SSeqs, ord : Nat, supply : SUBSET (STRING \X Nat),
           demand : SUBSET STRING, dst : Nat, jobs : SUBSET Nat, lsup : BOOLEAN,
           dtm : BOOLEAN]
SLookup == [seq : Seqs, keys : SUBSET STRING, pending : SUBSET STRING, hits : SUBSET STRING,
            sent : SUBSET STRING]
Write == [rk : SKeys, dst : Nat, keys : SUBSET STRING, jobs : SUBSET Nat]
LoadResult == [r : LoadResults, by : Nat]
StoreJob == [st : StoreStates, rnd : SSeqs]
IsMap(f, D, T) == DOMAIN f \subseteq D /\ \A k \in DOMAIN f : f[k] \in T

TypeInv ==
    /\ scn \in DOMAIN Scenarios
    /\ sess \in [Peers -> SessionStates]
    /\ reg \in [Peers -> BOOLEAN]
    /\ \A p \in Peers : queue[p] \in Seq(Frame) /\ chan[p] \in Seq(Frame)
    /\ cut \in BOOLEAN /\ lost \subseteq Peers /\ faults \in 0 .. MaxFaults /\ compat \in BOOLEAN
    /\ \A p \in Peers : IsMap(cr[p], CKeys, CRound) /\ IsMap(sr[p], SKeys, SRound)
    /\ fl \in [Peers -> [Reqs -> 0 .. MaxRounds]]
    /\ xl \in [Peers -> [Reqs -> SSeqs]]
    /\ lr \in [Peers -> [Reqs -> SSeqs]]
    /\ \A p \in Peers, q \in Reqs : cl[p][q] \in Seq(CLookup) /\ sl[p][q] \in Seq(SLookup)
    /\ nlk \in [Peers -> Nat] /\ nlr \in [Peers -> Nat] /\ nfin \in [Peers -> Nat]
    /\ fin \in [Peers -> SUBSET Reqs]
    /\ pf \in [Peers -> SUBSET Reqs]
    /\ \A p \in Peers : wr[p] \subseteq Write
    /\ \A p \in Peers : lres[p] \in Seq(LoadResult) /\ sres[p] \in Seq(StoreJob)
    /\ perr \in BOOLEAN
    /\ gone \subseteq Peers
    /\ \A f \in fired : f \in STRING \X STRING \X STRING \X STRING
    /\ act \in STRING \X STRING

-----------------------------------------------------------------------------
(* The acting peer's variables as one record, and writing it back. *)

Load(p, name) ==
    [sess |-> sess[p], reg |-> reg[p], queue |-> queue[p], cr |-> cr[p],
     fl |-> fl[p], xl |-> xl[p],
     lr |-> lr[p], cl |-> cl[p], nlk |-> nlk[p], nlr |-> nlr[p], nfin |-> nfin[p],
     fin |-> fin[p], pf |-> pf[p],
     sr |-> sr[p], sl |-> sl[p], wr |-> wr[p], lres |-> lres[p], sres |-> sres[p],
     out |-> chan[p], in |-> chan[Other(p)], cut |-> cut, compat |-> compat,
     faults |-> faults, perr |-> FALSE, fired |-> {}, act |-> <<name, p>>]

Commit(p, L) ==
    /\ sess' = [sess EXCEPT ![p] = L.sess]
    /\ reg' = [reg EXCEPT ![p] = L.reg]
    /\ queue' = [queue EXCEPT ![p] = L.queue]
    /\ cr' = [cr EXCEPT ![p] = L.cr]
    /\ fl' = [fl EXCEPT ![p] = L.fl]
    /\ xl' = [xl EXCEPT ![p] = L.xl]
    /\ lr' = [lr EXCEPT ![p] = L.lr]
    /\ cl' = [cl EXCEPT ![p] = L.cl]
    /\ nlk' = [nlk EXCEPT ![p] = L.nlk]
    /\ nlr' = [nlr EXCEPT ![p] = L.nlr]
    /\ nfin' = [nfin EXCEPT ![p] = L.nfin]
    /\ fin' = [fin EXCEPT ![p] = L.fin]
    /\ pf' = [pf EXCEPT ![p] = L.pf]
    /\ sr' = [sr EXCEPT ![p] = L.sr]
    /\ sl' = [sl EXCEPT ![p] = L.sl]
    /\ wr' = [wr EXCEPT ![p] = L.wr]
    /\ lres' = [lres EXCEPT ![p] = L.lres]
    /\ sres' = [sres EXCEPT ![p] = L.sres]
    /\ chan' = [x \in Peers |-> IF x = p THEN (IF p \in gone THEN chan[p] ELSE L.out) ELSE L.in]
    /\ faults' = L.faults
    /\ perr' = (perr \/ L.perr)
    /\ fired' = IF TrackFired THEN L.fired ELSE {}
    /\ act' = IF TrackAct THEN L.act ELSE <<"", "">>
    /\ UNCHANGED <<scn, cut, lost, compat, gone>>

\* A role timer of this kind may fire in this scenario.
Timer(kind) == kind \in S.timers

\* A fault of this kind may happen now.
CanFault(kind) == faults < MaxFaults /\ kind \in S.faults
Faulted(L) == [L EXCEPT !.faults = @ + 1]

\* Record one machine step of this action.
Fire(L, m, t, s, d) == [L EXCEPT !.fired = @ \cup {<<m, t, s, d>>}]

\* The incoming frame has been consumed.
Pop(L) == [L EXCEPT !.in = Rest(@)]

\* A frame no declared transition accepts (ProtocolViolation): consumed, nothing else.
Reject(L) == [Pop(L) EXCEPT !.perr = TRUE]

\* ClientPart.request_live: a load or lookup of the request is open.
ReqLive(L, req) ==
    \/ \E k \in DOMAIN L.cr : k[1] = req /\ L.cr[k].st \in LiveCR
    \/ L.cl[req] # <<>>
    \/ L.lr[req] # Unbound

\* ClientPart.withheld: under retire, a terminal fetch is dropped while its request is live.
Withheld(L, m) == PB.retire /\ m[1] = "fetch" /\ m[4] = {} /\ ReqLive(L, m[2])

\* Session.send: straight out when ready (or a handshake frame), else queued in order.
Send(L, m) ==
    IF L.sess = "ready" \/ m[1] \in Handshake
    THEN IF Withheld(L, m) THEN L
         ELSE [L EXCEPT !.out = Enqueue(@, [m EXCEPT ![8] = (L.sess = "ready" \/ m[1] \in Handshake)],
                                    L.cut)]
    ELSE [L EXCEPT !.queue = Append(@, m)]

\* The flush proper of Session.flush_queue (after ClientPart.hand_off: Flush below).
FlushQueue(L) ==
    LET Keep(m) == ~Withheld(L, m)
        q == SelectSeq(L.queue, Keep)
    IN [L EXCEPT !.out = EnqueueAll(@, [i \in 1 .. Len(q) |->
                                       [q[i] EXCEPT ![8] = (L.sess = "ready")]], L.cut),
                 !.queue = <<>>]

\* Keys in a fixed order, for loops (dict order in the Python code).
ReqSeq == CHOOSE s \in [1 .. Cardinality(Reqs) -> Reqs] : Reqs = {s[i] : i \in DOMAIN s}
RKeys(req) == [i \in 1 .. MaxRounds + 1 |-> <<req, i - 2>>]
CKeysOf(req) == [i \in 1 .. MaxRounds |-> <<req, i - 1>>]
AllRKeys == [i \in 1 .. Cardinality(Reqs) * (MaxRounds + 1) |->
                 RKeys(ReqSeq[((i - 1) \div (MaxRounds + 1)) + 1])[((i - 1) % (MaxRounds + 1)) + 1]]
AllCKeys == [i \in 1 .. Cardinality(Reqs) * MaxRounds |->
                 CKeysOf(ReqSeq[((i - 1) \div MaxRounds) + 1])[((i - 1) % MaxRounds) + 1]]

FireS(L, t, d) == Fire([L EXCEPT !.sess = d], "session", t, L.sess, d)

-----------------------------------------------------------------------------
(* Consumer role helpers (p2pfsm/session/client.py and core.py) *)

CSt(L, k) == IF k \in DOMAIN L.cr THEN L.cr[k].st ELSE "none"

FireCR(L, k, t, d) == Fire([L EXCEPT !.cr[k].st = d], "client_round", t, L.cr[k].st, d)

\* ClientPart.hand_off: every load round still queued is handed to the transport; then
\* the queued frames go out in order, now that we are ready (less a terminal fetch
\* Withheld). A round whose deadline is due by then is retired first: the spec has no
\* clock, so that is ClientRoundTimerLoad taking the queued round before the flush.
HandOne(L, k) == IF CSt(L, k) = "queued" THEN FireCR(L, k, "handed_off", "loading") ELSE L
RECURSIVE HandFrom(_, _)
HandFrom(L, ks) == IF ks = <<>> THEN L ELSE HandFrom(HandOne(L, Head(ks)), Tail(ks))
\* Session.flush_queue: the hand-off, then the flush.
Flush(L) == FlushQueue(HandFrom(L, AllCKeys))

\* ClientRound._report: the job's one LoadResult; `by` is the ghost job of the frame.
Report(L, j, r, by) ==
    [L EXCEPT !.lres[j] = [r |-> IF @.r = "pending" THEN r ELSE "twice", by |-> by]]

\* Session.forget_load: a round that ended `aborted` (or `released`) raises the request's
\* round floor, since a late duplicate abort_ack of it may still arrive. BugP4: no floor,
\* round numbers restart as soon as the request's rounds are pruned (vLLM G4, PR #56471).
Forget(L, k) ==
    LET req == k[1]
        floor == IF L.cr[k].st \in {"aborted", "released"} /\ ~BugP4
                 THEN Max({L.fl[req], k[2] + 1}) ELSE L.fl[req]
    IN [L EXCEPT !.cr = MapDel(@, k), !.fl[req] = floor]

\* Session._alloc_round: the floor, or above every live load round of the request.
Alloc(L, req) ==
    LET live == {k[2] : k \in {x \in DOMAIN L.cr : x[1] = req}}
    IN IF live = {} THEN L.fl[req] ELSE Max({L.fl[req], Max(live) + 1})

AbortFrame(L, k) == Msg("abort_fetch", k[1], k[2], {}, L.cr[k].job, FALSE, {})

\* ClientRound.send_abort.
SendAbort(L, k) == Send(L, AbortFrame(L, k))

\* ClientRound: a result reported and the round forgotten.
Complete(L, k, t, d, r, by) == Forget(Report(FireCR(L, k, t, d), L.cr[k].job, r, by), k)

\* ClientRound.report_released_<cause>: the held destination is free (DestinationReleased).
Free(L, j, by) == [L EXCEPT !.lres[j] = [r |-> IF @.r = "orphan" THEN "freed" ELSE "twice",
                                           by |-> by]]
Release(L, k, t, by) == Forget(Free(FireCR(L, k, t, "released"), L.cr[k].job, by), k)

\* The failed result of an abort reported at its sending (atSend): the destination is
\* held. BugReleaseEarly: reported released instead.
HeldResult == IF BugReleaseEarly THEN "fail" ELSE "orphan"

\* session_lost (t) on one load round (Session._end_roles): orphaned (its destination
\* held), or done when the session was never ready (session_lost_unsent: the fetch never
\* left the queue; a reported round's held destination is released then).
LoseRound(L, k, t) ==
    CASE CSt(L, k) = "queued" -> Complete(L, k, t, "done", "fail", 0)
      [] CSt(L, k) \in {"loading", "aborting"} /\ t = "session_lost" ->
             Report(FireCR(L, k, t, "orphaned"), L.cr[k].job, "orphan", 0)
      [] CSt(L, k) \in {"loading", "aborting"} -> Complete(L, k, t, "done", "fail", 0)
      [] CSt(L, k) = "reported" /\ t = "session_lost" -> FireCR(L, k, t, "orphaned")
      [] CSt(L, k) = "reported" -> Release(L, k, t, 0)
      [] OTHER -> L

\* Abort a loading round (its deadline, or the host's finish: t): wait for the peer's
\* confirmation, or (atSend) report the failure now and hold the destination.
AbortLoad(L, k, t) ==
    IF PB.atSend
    THEN SendAbort(Report(FireCR(L, k, t, "reported"), L.cr[k].job, HeldResult, 0), k)
    ELSE SendAbort(FireCR(L, k, t, "aborting"), k)

\* Session.release_held (consumer): every destination held past the session's end is
\* released (peer_gone on each orphaned round, in key order).
ReleaseOne(L, k) == IF CSt(L, k) = "orphaned" THEN Release(L, k, "peer_gone", 0) ELSE L
RECURSIVE ReleaseFrom(_, _)
ReleaseFrom(L, ks) == IF ks = <<>> THEN L ELSE ReleaseFrom(ReleaseOne(L, Head(ks)), Tail(ks))
ReleaseHeld(L) == ReleaseFrom(L, AllCKeys)

\* Retire a queued round (its deadline, or the host's finish: t): its fetch is withdrawn
\* from the queue, the job fails with its destination free (nothing was sent) and the
\* request's terminal fetch, naming the round, is sent (queued, or Withheld).
RetireLoad(L, k, t) ==
    LET NotIt(m) == ~(m[1] = "fetch" /\ m[4] # {} /\ m[2] = k[1] /\ m[3] = k[2])
        L1 == Complete([L EXCEPT !.queue = SelectSeq(@, NotIt)], k, t, "done", "fail", 0)
    IN Send(L1, Msg("fetch", k[1], k[2], {}, 0, FALSE, {}))

\* host_finish on one load round. BugP3: the round is dropped without a result (PR #52571).
FinishLoad(L, k) ==
    CASE CSt(L, k) = "queued" -> RetireLoad(L, k, "host_finish")
      [] CSt(L, k) = "loading" /\ BugP3 -> [SendAbort(L, k) EXCEPT !.cr = MapDel(@, k)]
      [] CSt(L, k) = "loading" -> AbortLoad(L, k, "host_finish")
      [] CSt(L, k) \in {"aborting", "reported"} -> FireCR(L, k, "host_finish", CSt(L, k))
      [] OTHER -> L

\* host_finish, session_lost or session_lost_unsent (trigger t) on one lookup.
EndLookup(L, lk, t) ==
    Fire([L EXCEPT !.nlr = @ + (IF lk.st = "probing" THEN 1 ELSE 0)],
         "client_lookup", t, lk.st, "cancelled")

-----------------------------------------------------------------------------
(* Producer role helpers (p2pfsm/session/server.py and core.py) *)

SSt(L, k) == IF k \in DOMAIN L.sr THEN L.sr[k].st ELSE "none"

FireSR(L, k, t, d) == Fire([L EXCEPT !.sr[k].st = d], "server_round", t, L.sr[k].st, d)

\* Insertion order of the request's rounds (the order of Session._rounds[req]).
NextOrd(L, req) == 1 + Max({L.sr[x].ord : x \in {y \in DOMAIN L.sr : y[1] = req}} \cup {0})

\* A round not yet open is created (Session._round_for).
Open(L, k, seq) ==
    IF k \in DOMAIN L.sr THEN L
    ELSE [L EXCEPT !.sr = MapPut(@, k, NewSR(seq, NextOrd(L, k[1])))]

Inflight(L, k) == {w \in L.wr : w.rk = k}
SupplyKeys(R) == {e[1] : e \in R.supply}

\* ServerRound._add: supply.setdefault(key, ...), and the job's pin.
AddSupply(L, k, keys, j) ==
    LET have == SupplyKeys(L.sr[k])
    IN [L EXCEPT !.sr[k].supply = @ \cup {<<x, j>> : x \in keys \ have},
                 !.sr[k].jobs = @ \cup {j}]

\* ServerRound.write_matched: one write for every key both supplied and demanded.
WriteMatched(L, k) ==
    LET R == L.sr[k]
        matched == {e \in R.supply : e[1] \in R.demand}
        mkeys == {e[1] : e \in matched}
    IN IF matched = {} THEN L
       ELSE [L EXCEPT !.sr[k].supply = @ \ matched, !.sr[k].demand = @ \ mkeys,
                      !.wr = @ \cup {[rk |-> k, dst |-> R.dst, keys |-> mkeys,
                                      jobs |-> {e[2] : e \in matched}]}]

\* A store job's one StoreResult: its pins may be released now.
Unpin(st) == IF st = "pinned" THEN "released" ELSE "twice"
ReleaseJob(L, j) == [L EXCEPT !.sres[j].st = Unpin(@)]

\* ServerRound.release_jobs + Session.forget_round.
EndRound(L, k) ==
    LET js == L.sr[k].jobs
        s == L.sres
    IN [L EXCEPT !.sres = [j \in DOMAIN s |->
                              IF j \in js THEN [s[j] EXCEPT !.st = Unpin(@)] ELSE s[j]],
                 !.sr = MapDel(@, k)]

WireSeq(R) == IF R.seq = Unbound THEN 0 ELSE R.seq

\* A round's reply: transfer_done(ok) or abort_ack, for the round as it ended (R).
Done(L, k, R, ok) == Send(L, Msg("transfer_done", k[1], WireSeq(R), {}, R.dst, ok, {}))
AbortAckOf(L, k, R) == Send(L, Msg("abort_ack", k[1], WireSeq(R), {}, R.dst, FALSE, {}))

\* Session._settle: `settle` on a round after every event touching it; the reply a
\* round sends when it ends is the one its state owes.
Settle(L, k) ==
    LET st == SSt(L, k)
        R == L.sr[k]
        quiet == Inflight(L, k) = {}
        End(L1) == EndRound(FireSR(L1, k, "settle", "done"), k)
    IN CASE st \in {"none", "done"} -> L
         [] st \in {"serving", "finishing"} /\ R.demand = {} /\ quiet -> End(Done(L, k, R, TRUE))
         [] st = "finishing" /\ quiet -> End(Done(L, k, R, FALSE))
         [] st = "draining_abort" /\ quiet -> End(AbortAckOf(L, k, R))
         [] st = "draining_failed" /\ quiet -> End(Done(L, k, R, FALSE))
         [] st = "draining_silent" /\ quiet -> End(L)
         [] OTHER -> FireSR(L, k, "settle", st)

\* session_lost on one serve round, then settle.
LoseServe(L, k) ==
    IF SSt(L, k) = "none" THEN L
    ELSE Settle(FireSR(L, k, "session_lost", "draining_silent"), k)

\* host_finish or recv_terminal_fetch (trigger t) on one serve round, then settle.
CloseRound(L, k, t) ==
    LET st == SSt(L, k) IN
    IF st = "none" THEN L
    ELSE IF t = "host_finish"
    THEN Settle(FireSR(L, k, t, CASE st = "supplied" -> "supply_closed"
                                  [] st = "pinned" -> "pinned_closed"
                                  [] st = "serving" -> "finishing"
                                  [] OTHER -> st), k)
    ELSE Settle(FireSR(L, k, t, IF st \in Draining THEN st ELSE "draining_silent"), k)

\* Session._settle_lookups: answer in arrival order; stop at the first that must wait.
\* Each lookup_resp carries the keys no earlier part of the lookup carried ("sent").
\* Where the scenario lists "split", a producer may also (Parts) send the oldest waiting
\* lookup's settled keys at once (part), as answer_lookups_in_parts does, and fold an
\* answer into the frame of the next lookup of the request (co) when that one is
\* answerable too and their keys do not overlap (the spec's frames hold key sets; p2pfsm
\* never coalesces, other producers may). ck / ch: the keys and hits carried so far.
RECURSIVE SettleFrom(_, _, _, _, _, _)
SettleFrom(L, req, part, co, ck, ch) ==
    IF L.sl[req] = <<>> THEN L
    ELSE LET ls == L.sl[req]
             h == Head(ls)
             rest == h.keys \ h.sent
         IN IF h.pending = {}
            THEN LET L1 == Fire([L EXCEPT !.sl[req] = Tail(@)],
                                "server_lookup", "settle", "resolving", "answered")
                     fold == co /\ Len(ls) > 1 /\ ls[2].pending = {}
                             /\ (ls[2].keys \ ls[2].sent) \cap (ck \cup rest) = {}
                 IN IF fold
                    THEN SettleFrom(L1, req, part, co, ck \cup rest, ch \cup (h.hits \cap rest))
                    ELSE SettleFrom(Send(L1, Msg("lookup_resp", req, Unbound, ck \cup rest, 0,
                                                 FALSE, ch \cup (h.hits \cap rest))),
                                    req, part, co, {}, {})
            ELSE LET now == rest \ h.pending
                 IN IF part /\ now # {}
                    THEN Send(Fire([L EXCEPT !.sl[req][1].sent = @ \cup now],
                                   "server_lookup", "settle", "resolving", "resolving"),
                              Msg("lookup_resp", req, Unbound, now, 0, FALSE, h.hits \cap now))
                    ELSE Fire(L, "server_lookup", "settle", "resolving", "resolving")

\* How a producer may answer: in one frame per lookup, or (with "split") in parts and
\* coalesced frames, chosen at each settle.
Parts == IF "split" \in S.faults THEN BOOLEAN \X BOOLEAN ELSE {<<FALSE, FALSE>>}
SettleLookups(L, req, how) == SettleFrom(L, req, how[1], how[2], {}, {})

-----------------------------------------------------------------------------
(* Loops over instances, in order *)

\* One step of a loop: apply the helper named op to element x.
Apply(L, x, op, arg) ==
    CASE op = "lose_round" -> LoseRound(L, x, arg)
      [] op = "finish_load" -> FinishLoad(L, x)
      [] op = "end_lookup" -> EndLookup(L, x, arg)
      [] op = "drop_served" -> Fire(L, "server_lookup", "request_closed", "resolving", "dropped")
      [] op = "lose_serve" -> LoseServe(L, x)
      [] op = "close_round" -> CloseRound(L, x, arg)

RECURSIVE Each(_, _, _, _)
Each(L, xs, op, arg) ==
    IF xs = <<>> THEN L ELSE Each(Apply(L, Head(xs), op, arg), Tail(xs), op, arg)

\* host_finish or session_lost on every lookup of one request; the list is emptied.
EndLookups(L, req, t) == [Each(L, L.cl[req], "end_lookup", t) EXCEPT !.cl[req] = <<>>]

\* request_closed on every served lookup of one request.
DropServed(L, req) == [Each(L, L.sl[req], "drop_served", "") EXCEPT !.sl[req] = <<>>]

RECURSIVE EachReq(_, _, _)
EachReq(L, qs, t) ==
    IF qs = <<>> THEN L
    ELSE EachReq(IF t = "drop_served" THEN DropServed(L, Head(qs))
                 ELSE EndLookups(L, Head(qs), t), Tail(qs), t)

\* The trigger the session's end fires on load rounds and lookups: its source state s
\* tells whether it was ever ready (end_work_sent) or not (end_work_queued: a job's frame
\* never left the queue, and its result says never_sent).
LostTrigger(s) == IF s = "ready" THEN "session_lost" ELSE "session_lost_unsent"

\* Session._end_roles: every machine of both roles learns that the session is gone; t is
\* LostTrigger of the state the session ended from.
EndRoles(L, t) ==
    LET L1 == Each(L, AllCKeys, "lose_round", t)
        L2 == EachReq(L1, ReqSeq, t)
        L3 == [L2 EXCEPT !.lr = [q \in Reqs |-> Unbound]]
        L4 == EachReq(L3, ReqSeq, "drop_served")
    IN Each(L4, AllRKeys, "lose_serve", "")

\* Session._die and end_work_* (the session machine has already moved to dead from s).
Die(L, s) == EndRoles([L EXCEPT !.queue = <<>>], LostTrigger(s))

\* Session._close_request: the request ended (terminal fetch or host finish).
CloseRequest(L, req, t) ==
    Each(DropServed([L EXCEPT !.xl[req] = Unbound], req), RKeys(req), "close_round", t)

-----------------------------------------------------------------------------
(* Host actions *)

\* Session._on_start.
SessionHostStart(p) ==
    /\ sess[p] = "idle"
    /\ Commit(p, Send(FireS(Load(p, "SessionHostStart"), "host_start", "connecting"), Ctl("connect")))

\* Session._on_close: best-effort disconnect; every outstanding job gets its result.
\* Closing a session that has already ended ends nothing (a graceful shutdown): no fault;
\* a dead one's disconnect tells a peer that may still hold the session live (a one-sided
\* loss); an ended one sends nothing (its peer disconnected, or was sent our disconnect).
SessionHostClose(p) ==
    /\ sess[p] # "closed" /\ (sess[p] \in Ended \/ CanFault("close"))
    /\ LET L0 == Load(p, "SessionHostClose")
           L == IF L0.sess \in Ended THEN L0 ELSE Faulted(L0)
       IN
       Commit(p, IF L.sess \in Live
                 THEN EndRoles([Send(FireS(L, "host_close", "closed"), Ctl("disconnect"))
                                EXCEPT !.queue = <<>>], LostTrigger(L.sess))
                 ELSE IF L.sess = "dead" /\ ~BugSilentLoss
                 THEN Send(FireS(L, "host_close", "closed"), Ctl("disconnect"))
                 ELSE FireS(L, "host_close", "closed"))

\* ConsumerPart.on_host_fetch: under a profile that ends the session on an overdue lookup
\* answer (lookupEnds), the request's probing lookups are reported now (request_fetched)
\* and wait one more period for a late answer, expired; otherwise they keep waiting.
Fetched(L, req) ==
    LET probing == {i \in 1 .. Len(L.cl[req]) : L.cl[req][i].st = "probing"}
    IN IF ~PB.lookupEnds \/ probing = {} THEN L
       ELSE Fire([L EXCEPT !.cl[req] = [i \in DOMAIN L.cl[req] |->
                                          IF i \in probing THEN [L.cl[req][i] EXCEPT !.st = "expired"]
                                          ELSE L.cl[req][i]],
                           !.nlr = @ + Cardinality(probing)],
                 "client_lookup", "request_fetched", "probing", "expired")

\* Session._on_host_fetch: a load job for `keys` into fresh destination blocks.
ClientRoundHostFetch(p) ==
    /\ p \in LoadPeers /\ sess[p] # "idle" /\ Len(lres[p]) < S.loads
    /\ \E req \in Reqs, keys \in S.fks :
         LET L == Load(p, "ClientRoundHostFetch")
             j == Len(L.lres) + 1
             seq == IF L.lr[req] = Unbound THEN Alloc(L, req) ELSE L.lr[req]
             k == <<req, seq>>
             st == IF PB.retire /\ L.sess # "ready" THEN "queued" ELSE "loading"
         IN IF L.sess \notin Live
            THEN Commit(p, [FireS(L, "host_fetch_over", L.sess)
                              EXCEPT !.lres = Append(@, [r |-> "fail", by |-> 0])])
            ELSE /\ seq < MaxRounds
                 /\ Commit(p, Send(Fetched(Fire([L EXCEPT !.lres = Append(@, [r |-> "pending", by |-> 0]),
                                                  !.lr[req] = Unbound,
                                                  !.cr = MapPut(@, k, [st |-> st, job |-> j])],
                                        "client_round", "host_fetch", "new", st), req),
                                   Msg("fetch", req, seq, keys, j, FALSE, {})))

\* Session._on_host_lookup: probe the peer for `keys`.
ClientLookupHostLookup(p) ==
    /\ p \in LoadPeers /\ sess[p] # "idle" /\ nlk[p] < S.lookups
    /\ \E req \in Reqs, keys \in S.lks :
         LET L == Load(p, "ClientLookupHostLookup")
             seq == IF L.lr[req] = Unbound THEN Alloc(L, req) ELSE L.lr[req]
         IN IF L.sess \notin Live
            THEN Commit(p, [FireS(L, "host_lookup_over", L.sess) EXCEPT !.nlk = @ + 1,
                                                                        !.nlr = @ + 1])
            ELSE /\ seq < MaxRounds
                 /\ Commit(p, Send(Fire([L EXCEPT !.nlk = @ + 1, !.lr[req] = seq,
                                                  !.cl[req] = Append(@, [st |-> "probing",
                                                                 seq |-> seq, keys |-> keys,
                                                                 got |-> {}])],
                                        "client_lookup", "host_lookup", "new", "probing"),
                                   Msg("lookup", req, seq, keys, 0, FALSE, {})))

\* Session._on_host_supply: stored blocks, pinned until the job's StoreResult. Never for
\* a request the host finished (HostFinished): the session refuses that
\* (LocalProtocolError). A new round opened for a request the peer finished (pf) takes
\* no supply: the job's StoreResult at once, and the round ends.
\* Session._supply_target: among the request's rounds not supplied by lookups (in
\* insertion order), the first whose remaining demand names one of the keys; else the
\* unbound round; else the newest round that is not serving (it rejects the job); else
\* the newest serving round; else a new unbound round.
SupplyTarget(L, req, keys) ==
    LET pd == {k \in DOMAIN L.sr : k[1] = req /\ ~L.sr[k].lsup}
        wants == {k \in pd : L.sr[k].demand \cap keys # {}}
        closed == {k \in pd : L.sr[k].st # "serving"}
        serving == {k \in pd : L.sr[k].st = "serving"}
        First(ks) == CHOOSE k \in ks : \A x \in ks : L.sr[k].ord <= L.sr[x].ord
        Last(ks) == CHOOSE k \in ks : \A x \in ks : L.sr[x].ord <= L.sr[k].ord
    IN CASE wants # {} -> First(wants)
         [] <<req, Unbound>> \in DOMAIN L.sr -> <<req, Unbound>>
         [] closed # {} -> Last(closed)
         [] serving # {} -> Last(serving)
         [] OTHER -> <<req, Unbound>>

\* Session._finished_by_host: the host finished req (remembered for a frame lifetime), or a
\* round of it is in a state only its finish leads to.
HostFinished(L, req) ==
    \/ req \in L.fin
    \/ \E k \in DOMAIN L.sr : k[1] = req /\ L.sr[k].st \in {"supply_closed", "pinned_closed",
                                                           "finishing"}

ServerRoundHostSupply(p) ==
    /\ p \in SupplyPeers /\ sess[p] # "idle" /\ Len(sres[p]) < S.stores
    /\ \E req \in Reqs, keys \in S.sks :
         LET L0 == Load(p, "ServerRoundHostSupply")
             j == Len(L0.sres) + 1
             L == [L0 EXCEPT !.sres = Append(@, [st |-> "pinned", rnd |-> Unbound])]
             k == SupplyTarget(L, req, keys)
             Ln == Open(L, k, Unbound)
             src == SSt(Ln, k)
         IN /\ ~HostFinished(L0, req)
            /\ Commit(p,
                 IF L.sess \in Ended \cup {"closed"}
                 THEN ReleaseJob(FireS(L, "host_supply_over", L.sess), j)
                 ELSE IF src = "new" /\ req \in L.pf
                 THEN EndRound(ReleaseJob(FireSR(Ln, k, "host_supply", "done"), j), k)
                 ELSE IF src \in {"new", "supplied"}
                 THEN Settle(AddSupply(FireSR(Ln, k, "host_supply", "supplied"), k, keys, j), k)
                 ELSE IF src = "serving"
                 THEN Settle(WriteMatched(AddSupply(FireSR(Ln, k, "host_supply", "serving"),
                                                    k, keys, j), k), k)
                 ELSE Settle(ReleaseJob(FireSR(Ln, k, "host_supply", src), j), k))

\* Session._on_host_decline: the host will not supply the rest of a fetched round. It
\* fails once no write of it can land (transfer_done(false)); a draining round keeps the
\* reply it owes. The scenario's finish budget (S.fin) bounds finishes and declines.
ServerRoundHostDecline(p) ==
    /\ p \in SupplyPeers /\ sess[p] # "idle" /\ nfin[p] < S.fin[p]
    /\ \E k \in DOMAIN sr[p] :
       /\ k[2] # Unbound
       /\ sr[p][k].st \in {"serving", "finishing"} \cup Draining
       /\ LET L == [Load(p, "ServerRoundHostDecline") EXCEPT !.nfin = @ + 1]
              st == L.sr[k].st
          IN Commit(p, Settle(FireSR(L, k, "host_decline",
                                     IF st \in Draining THEN st ELSE "draining_failed"), k))

\* Session._on_host_answer: the host resolves some pending keys of a served lookup as
\* hits or misses; hits are pinned (a new store job) as supply of the lookup's round.
ServerLookupHostAnswer(p) ==
    \E req \in Reqs :
    \E i \in 1 .. Len(sl[p][req]) :
    \E hits \in SUBSET sl[p][req][i].pending :
    \E miss \in SUBSET (sl[p][req][i].pending \ hits) :
       LET L0 == Load(p, "ServerLookupHostAnswer")
           lk == L0.sl[req][i]
           j == Len(L0.sres) + 1
           k == SKey(req, lk.seq)
           st == SSt(L0, k)
           canPin == st \in {"none", "pinned"} \/ BugP1
           L == IF hits # {} THEN [L0 EXCEPT !.sres = Append(@, [st |-> "pinned", rnd |-> lk.seq])]
                ELSE L0
           pinned == hits # {} /\ canPin
           \* A pin the round no longer takes: its StoreResult at once; the keys are MISS
           \* (server_lookup host_answer's guarded variant: refuse_pins, record_answers).
           L1 == IF hits # {} /\ ~canPin THEN ReleaseJob(L, j) ELSE L
           L2 == Fire([L1 EXCEPT !.sl[req][i].pending = @ \ (hits \cup miss),
                                 !.sl[req][i].hits = @ \cup (IF pinned THEN hits ELSE {})],
                      "server_lookup", "host_answer", "resolving", "resolving")
           Ln == Open(L2, k, lk.seq)
           src == SSt(Ln, k)
           L3 == IF pinned
                 THEN [AddSupply(FireSR(Ln, k, "lookup_pin",
                                        IF src \in {"new", "pinned"} THEN "pinned" ELSE src),
                                 k, hits, j) EXCEPT !.sr[k].lsup = TRUE]
                 ELSE L2
       IN /\ hits \cup miss # {}
          /\ (hits = {} \/ Len(sres[p]) < S.stores)
          /\ \E how \in Parts : Commit(p, SettleLookups(L3, req, how))

\* Session._on_host_finish: the host is done with `req`, on both roles.
ClientRoundHostFinish(p) ==
    /\ sess[p] # "idle" /\ nfin[p] < S.fin[p]
    /\ \E req \in Reqs :
         LET L0 == [Load(p, "ClientRoundHostFinish") EXCEPT !.nfin = @ + 1,
                                                             !.fin = @ \cup {req}]
             L1 == Each(L0, CKeysOf(req), "finish_load", "")
             L2 == EndLookups(L1, req, "host_finish")
             open == L2.lr[req]
             L3 == [L2 EXCEPT !.lr[req] = Unbound]
             L4 == IF open # Unbound /\ L3.sess \in Live
                   THEN Send(FireS(L3, "finish_lookup_round", L3.sess),
                             Msg("fetch", req, open, {}, 0, FALSE, {}))
                   ELSE L3
         IN Commit(p, CloseRequest(L4, req, "host_finish"))

-----------------------------------------------------------------------------
(* Frames: Session._on_frame and the _on_<type> handlers. A frame reaching a  *)
(* session that is not live is ignored (NetworkDiscard).                      *)

Incoming(p, t) ==
    /\ chan[Other(p)] # <<>>
    /\ Peek(chan[Other(p)])[1] = t
    /\ sess[p] \in Live

\* A request or response reaching a dead session: its peer may still hold the session
\* live (a one-sided loss), so the dead one answers it (unless BugSilentLoss).
Stale(p) ==
    /\ chan[Other(p)] # <<>>
    /\ sess[p] = "dead" /\ ~BugSilentLoss
    /\ Peek(chan[Other(p)])[1] \notin Handshake \cup {"bad_fetch"}

\* A disconnect reaching a dead session: the peer ended its side too.
DeadDisconnect(p) ==
    /\ chan[Other(p)] # <<>>
    /\ sess[p] = "dead" /\ ~BugSilentLoss
    /\ Peek(chan[Other(p)])[1] = "disconnect"

NetworkDiscard(p) ==
    /\ chan[Other(p)] # <<>>
    /\ sess[p] \notin Live /\ ~Stale(p) /\ ~DeadDisconnect(p)
    /\ Commit(p, Pop(Load(p, "NetworkDiscard")))

\* Session._on_stale: a dead session answers its peer's request or response with a
\* disconnect, rate-limited (at most one a second per session). The spec has no clock:
\* it answers unless a disconnect of ours is still on the wire, which bounds the
\* answers as the rate limit does (a peer re-sending its abort faster than it reads
\* would otherwise fill the channel). A peer that waits for this session keeps
\* sending, so an answer gets through.
SessionRecvStale(p) ==
    /\ Stale(p)
    /\ LET L == FireS(Pop(Load(p, "SessionRecvStale")), "recv_stale", "dead")
           due == ~\E i \in 1 .. Len(chan[p]) : chan[p][i][1] = "disconnect"
       IN Commit(p, IF due THEN Send(L, Ctl("disconnect")) ELSE L)

\* Past connecting, the session holds the connect of incarnation 0: one of incarnation 1
\* is the peer restarted (is_peer_restarted), which ends the session without a
\* disconnect (it would end the new incarnation's); the host then serves that connect
\* with a fresh session, which the spec leaves out (one session per peer). On a ready
\* session a connect of the same incarnation is the peer connecting again after it lost
\* its side (is_peer_reconnected, the same ending); here it is a duplicated connect,
\* and the peer, still ready, learns of the end from the dead session's answer to its
\* next frame (SessionRecvStale). Every spec peer sends an incarnation: the duplicate
\* connect error of a ready session is a vLLM peer's (tests/scenarios cover it).
SessionRecvConnect(p) ==
    /\ Incoming(p, "connect")
    /\ LET L == Pop(Load(p, "SessionRecvConnect"))
           restarted == Peek(chan[Other(p)])[5] = Restarted
       IN
       Commit(p, IF L.sess = "connecting" /\ L.compat
                 THEN FireS(L, "recv_connect", "registering")
                 ELSE IF restarted /\ L.sess = "ready"
                 THEN ReleaseHeld(Die(FireS(L, "recv_connect", "dead"), L.sess))
                 ELSE IF L.sess # "connecting" /\ (restarted \/ L.sess = "ready")
                 THEN Die(FireS(L, "recv_connect", "dead"), L.sess)
                 ELSE Die(Send(FireS(L, "recv_connect", "ended"), Ctl("disconnect")), L.sess))

SessionRecvConnectAck(p) ==
    /\ Incoming(p, "connect_ack")
    /\ LET L == Pop(Load(p, "SessionRecvConnectAck")) IN
       Commit(p, CASE L.sess = "registering" -> FireS(L, "recv_connect_ack", "registering_acked")
                   [] L.sess = "awaiting_ack" -> Flush(FireS(L, "recv_connect_ack", "ready"))
                   [] L.sess \in {"registering_acked", "ready"} ->
                          FireS(L, "recv_connect_ack", L.sess)
                   [] OTHER -> Die(Send(FireS(L, "recv_connect_ack", "ended"), Ctl("disconnect")),
                                   L.sess))

\* The peer ended the session: it knows, so nothing more is owed to it ("ended"). A dead
\* session (its transport lost, a one-sided loss) learns that its peer ended too.
SessionRecvDisconnect(p) ==
    /\ Incoming(p, "disconnect") \/ DeadDisconnect(p)
    /\ LET L == FireS(Pop(Load(p, "SessionRecvDisconnect")), "recv_disconnect", "ended") IN
       Commit(p, IF sess[p] = "dead" THEN L ELSE Die(L, sess[p]))

\* The session gate for requests (fetch, lookup, abort_fetch) ... A peer sends requests
\* only once ready, after its connect_ack on the same channel: a request reaching us in
\* awaiting_ack means that ack was lost (NetworkDrop), and the request stands for it
\* (flush, then serve). Only an accepted request fires the gate: a rejected one changes
\* nothing.
CanRequest(L) == L.sess \in {"awaiting_ack", "ready"}
GateRequest(L) == IF L.sess = "awaiting_ack" /\ ~BugNoImplicitAck
                  THEN Flush(FireS(L, "recv_request", "ready"))
                  ELSE FireS(L, "recv_request", L.sess)
\* ... and for responses (transfer_done, abort_ack, lookup_resp).
CanRespond(L) == L.sess = "ready"
GateResponse(L) == FireS(L, "recv_response", L.sess)

\* Session._on_fetch with keys: demand for (req, seq). An unbound round with supply
\* is adopted by the request's first fetch (and moves to the end of the insertion
\* order). A fetch for a lookup round whose pins expired fails at once (vLLM P7), and so
\* does one naming a new round of a request the host finished (its host is not asked);
\* the first is the session's reply (recv_expired_fetch), no round is opened for it.
\* An accepted fetch names a round of its request again: the peer did not finish it.
ServerRoundRecvFetch(p) ==
    /\ Incoming(p, "fetch")
    /\ Peek(chan[Other(p)])[4] # {}
    /\ LET L0 == Pop(Load(p, "ServerRoundRecvFetch"))
           m == AsRec(Peek(chan[Other(p)]))
           k == SKey(m.req, m.seq)
           ub == <<m.req, Unbound>>
           fresh == k \notin DOMAIN L0.sr
           expired == fresh /\ L0.xl[m.req] = m.seq
           adopt == fresh /\ SSt(L0, ub) \in {"supplied", "supply_closed"}
           src == IF adopt THEN SSt(L0, ub) ELSE IF fresh THEN "new" ELSE SSt(L0, k)
           L1 == [GateRequest(L0) EXCEPT !.pf = @ \ {m.req}]
           L2 == IF adopt
                 THEN [L1 EXCEPT !.sr = MapPut(MapDel(@, ub), k,
                                               [@[ub] EXCEPT !.seq = m.seq,
                                                             !.ord = NextOrd(L1, m.req)])]
                 ELSE Open(L1, k, m.seq)
           R == L2.sr[k]
           unservable == src \in {"pinned", "pinned_closed"} /\ ~(m.keys \subseteq SupplyKeys(R))
           \* A new round of a request the host finished: no supply can come (is_host_finished).
           closed == src = "new" /\ HostFinished(L0, m.req)
           L3 == [L2 EXCEPT !.sr[k].dst = m.dst, !.sr[k].demand = m.keys, !.sr[k].dtm = TRUE]
       IN Commit(p,
            IF ~CanRequest(L0) THEN Reject(Load(p, "ServerRoundRecvFetch"))
            ELSE IF expired
            THEN Send(FireS([L1 EXCEPT !.xl[m.req] = Unbound], "recv_expired_fetch", L1.sess),
                      Msg("transfer_done", m.req, m.seq, {}, m.dst, FALSE, {}))
            ELSE IF src \notin {"new", "supplied", "supply_closed", "pinned", "pinned_closed"}
            THEN Reject(Load(p, "ServerRoundRecvFetch"))
            ELSE IF unservable \/ closed
            THEN EndRound(Send(FireSR(L3, k, "recv_fetch", "done"),
                               Msg("transfer_done", m.req, m.seq, {}, m.dst, FALSE, {})), k)
            ELSE Settle(WriteMatched(FireSR(L3, k, "recv_fetch",
                                            IF src \in {"supply_closed", "pinned_closed"}
                                            THEN "finishing" ELSE "serving"), k), k))

\* Session._answer_bad_fetch: a fetch rejected as malformed (a protocol violation: perr)
\* that names its round gets transfer_done(false) for it at once, unless a round of ours
\* already has that round's demand (its own reply comes; a second reply could fail the
\* load while a write of that round may still land). No round is created or changed.
SessionRecvBadFetch(p) ==
    /\ Incoming(p, "bad_fetch")
    /\ LET L0 == Reject(Load(p, "SessionRecvBadFetch"))
           m == AsRec(Peek(chan[Other(p)]))
           k == SKey(m.req, m.seq)
           served == k \in DOMAIN L0.sr /\ L0.sr[k].dst # 0
       IN Commit(p, IF CanRequest(L0) /\ ~served
                    THEN Send(FireS(L0, "recv_bad_fetch", L0.sess),
                              Msg("transfer_done", m.req, m.seq, {}, m.dst, FALSE, {}))
                    ELSE L0)

\* Session._on_fetch without keys: the consumer finished the request (remembered in pf).
ServerRoundRecvTerminalFetch(p) ==
    /\ Incoming(p, "fetch")
    /\ Peek(chan[Other(p)])[4] = {}
    /\ LET L0 == Pop(Load(p, "ServerRoundRecvTerminalFetch"))
           m == AsRec(Peek(chan[Other(p)]))
       IN Commit(p, IF ~CanRequest(L0) THEN Reject(Load(p, "ServerRoundRecvTerminalFetch"))
                    ELSE CloseRequest([GateRequest(L0) EXCEPT !.pf = @ \cup {m.req}], m.req,
                                      "recv_terminal_fetch"))

\* Session._on_lookup: ask the host about every key (the peer names a round of the
\* request again: it did not finish it).
ServerLookupRecvLookup(p) ==
    /\ Incoming(p, "lookup")
    /\ LET L0 == Pop(Load(p, "ServerLookupRecvLookup"))
           m == AsRec(Peek(chan[Other(p)]))
           k == SKey(m.req, m.seq)
           demanded == k \in DOMAIN L0.sr /\ L0.sr[k].dst # 0
       IN \E how \in Parts : Commit(p,
            IF ~CanRequest(L0) \/ (demanded /\ ~BugP1)
            THEN Reject(Load(p, "ServerLookupRecvLookup"))
            ELSE SettleLookups(
                   Fire([GateRequest(L0) EXCEPT !.pf = @ \ {m.req}, !.sl[m.req] =
                           Append(@, [seq |-> m.seq, keys |-> m.keys, pending |-> m.keys,
                                      hits |-> {}, sent |-> {}])],
                        "server_lookup", "recv_lookup", "new", "resolving"), m.req, how))

\* ServerRound.release_unread_jobs: an abort releases now the round's store jobs no write
\* in flight reads, and they leave the round (it starts no write once draining).
ReleaseUnreadJobs(L, k) ==
    LET still == UNION {v.jobs : v \in Inflight(L, k)}
        js == L.sr[k].jobs \ still
        s == L.sres
    IN [L EXCEPT !.sres = [j \in DOMAIN s |->
                              IF j \in js THEN [s[j] EXCEPT !.st = Unpin(@)] ELSE s[j]],
                 !.sr[k].jobs = @ \ js]

\* Session._on_abort_fetch: stop writing; ack once nothing of the round can land. An
\* abort naming no round of ours is acked at once by the session (recv_unknown_abort).
ServerRoundRecvAbortFetch(p) ==
    /\ Incoming(p, "abort_fetch")
    /\ LET L0 == Pop(Load(p, "ServerRoundRecvAbortFetch"))
           m == AsRec(Peek(chan[Other(p)]))
           k == SKey(m.req, m.seq)
           L1 == GateRequest(L0)
       IN Commit(p,
            IF ~CanRequest(L0) THEN Reject(Load(p, "ServerRoundRecvAbortFetch"))
            ELSE IF k \notin DOMAIN L1.sr
            THEN Send(FireS(L1, "recv_unknown_abort", L1.sess),
                      Msg("abort_ack", m.req, m.seq, {}, m.dst, FALSE, {}))
            ELSE LET L2 == IF L1.sr[k].st = "draining_abort" THEN L1
                           ELSE ReleaseUnreadJobs(L1, k)
                 IN Settle(FireSR(L2, k, "recv_abort_fetch", "draining_abort"), k))

\* Session._on_transfer_done.
ClientRoundRecvTransferDone(p) ==
    /\ Incoming(p, "transfer_done")
    /\ LET L0 == Pop(Load(p, "ClientRoundRecvTransferDone"))
           m == AsRec(Peek(chan[Other(p)]))
           k == <<m.req, m.seq>>
       IN Commit(p,
            IF ~CanRespond(L0) THEN Reject(Load(p, "ClientRoundRecvTransferDone"))
            ELSE IF k \notin DOMAIN L0.cr THEN L0
            ELSE IF L0.cr[k].st = "reported"
            THEN Release(GateResponse(L0), k, "recv_transfer_done", m.dst)
            ELSE Complete(GateResponse(L0), k, "recv_transfer_done",
                          IF L0.cr[k].st = "aborting" THEN "aborted" ELSE "done",
                          IF m.ok THEN "ok" ELSE "fail", m.dst))

\* Session._on_abort_ack.
ClientRoundRecvAbortAck(p) ==
    /\ Incoming(p, "abort_ack")
    /\ LET L0 == Pop(Load(p, "ClientRoundRecvAbortAck"))
           m == AsRec(Peek(chan[Other(p)]))
           k == <<m.req, m.seq>>
       IN Commit(p,
            IF ~CanRespond(L0) \/ CSt(L0, k) = "loading" THEN Reject(Load(p, "ClientRoundRecvAbortAck"))
            ELSE IF k \notin DOMAIN L0.cr THEN L0
            ELSE IF L0.cr[k].st = "reported"
            THEN Release(GateResponse(L0), k, "recv_abort_ack", m.dst)
            ELSE Complete(GateResponse(L0), k, "recv_abort_ack", "aborted", "fail", m.dst))

\* Session._on_lookup_resp: each key of the answer on its own (a producer may split and
\* coalesce answers), to a lookup of the request still waiting for it: in the round of
\* the oldest such lookup, the oldest probing one, else the oldest expired one. Each
\* lookup the frame answers takes its keys; one that has every key ends ("answered",
\* reported; "discarded" when it had expired), the others keep waiting.
ClientLookupRecvLookupResp(p) ==
    /\ Incoming(p, "lookup_resp")
    /\ LET L0 == Pop(Load(p, "ClientLookupRecvLookupResp"))
           m == AsRec(Peek(chan[Other(p)]))
           ls == L0.cl[m.req]
           Waiting(key) == {x \in 1 .. Len(ls) : key \in ls[x].keys \ ls[x].got}
           Target(key) ==
               LET w == Waiting(key)
                   same == {x \in w : ls[x].seq = ls[Min(w)].seq}
                   probing == {x \in same : ls[x].st = "probing"}
               IN IF probing # {} THEN Min(probing) ELSE Min(same)
           taken == {key \in m.keys : Waiting(key) # {}}
           touched == {Target(key) : key \in taken}
           Part(x) == {key \in taken : Target(key) = x}
           got == [x \in 1 .. Len(ls) |-> ls[x].got \cup (IF x \in touched THEN Part(x) ELSE {})]
           ends == {x \in touched : got[x] = ls[x].keys}
           kept == SelectSeq([x \in 1 .. Len(ls) |-> [ls[x] EXCEPT !.got = got[x]]],
                             LAMBDA lk : lk.got # lk.keys)
           steps == {<<"client_lookup", "recv_lookup_resp", ls[x].st,
                       IF x \in ends THEN (IF ls[x].st = "probing" THEN "answered" ELSE "discarded")
                       ELSE ls[x].st>> : x \in touched}
       IN Commit(p,
            IF ~CanRespond(L0) THEN Reject(Load(p, "ClientLookupRecvLookupResp"))
            ELSE IF touched = {} THEN L0
            ELSE [GateResponse(L0) EXCEPT !.cl[m.req] = kept,
                    !.nlr = @ + Cardinality({x \in ends : ls[x].st = "probing"}),
                    !.fired = @ \cup steps])

-----------------------------------------------------------------------------
(* Executor events: registration, writes, transport *)

SessionRegistrationDone(p) ==
    /\ sess[p] \in {"registering", "registering_acked"}
    /\ LET L == [Load(p, "SessionRegistrationDone") EXCEPT !.reg = TRUE] IN
       Commit(p, IF L.sess = "registering"
                 THEN Send(FireS(L, "registration_done", "awaiting_ack"), Ctl("connect_ack"))
                 ELSE Flush(Send(FireS(L, "registration_done", "ready"), Ctl("connect_ack"))))

SessionRegistrationFailed(p) ==
    /\ sess[p] \in {"registering", "registering_acked"} /\ CanFault("regfail")
    /\ Commit(p, Die(Send(FireS(Faulted(Load(p, "SessionRegistrationFailed")), "registration_failed", "ended"),
                         Ctl("disconnect")), sess[p]))

\* A write completed after landing (WriteFinished ok).
ServerRoundWriteDone(p) ==
    \E w \in wr[p] :
       LET L == [Load(p, "ServerRoundWriteDone") EXCEPT !.wr = @ \ {w}] IN
       Commit(p, Settle(FireSR(L, w.rk, "write_done", L.sr[w.rk].st), w.rk))

\* ServerRound.release_failed_reads: the store jobs the ended write w read that no write
\* of its round still in flight reads get their StoreResult now and leave the round (a
\* draining round starts no write, so nothing reads them any more).
ReleaseFailedReads(L, w) ==
    LET still == UNION {v.jobs : v \in {v \in L.wr : v.rk = w.rk}}
        js == (w.jobs \ still) \cap L.sr[w.rk].jobs
        s == L.sres
    IN [L EXCEPT !.sres = [j \in DOMAIN s |->
                              IF j \in js THEN [s[j] EXCEPT !.st = Unpin(@)] ELSE s[j]],
                 !.sr[w.rk].jobs = @ \ js]

\* A write failed, or was cancelled before landing (WriteFinished not ok). A
\* cancelled write of a draining round is routine; any other failure is a fault.
ServerRoundWriteFailed(p) ==
    \E w \in wr[p] :
       LET L0 == ReleaseFailedReads([Load(p, "ServerRoundWriteFailed") EXCEPT !.wr = @ \ {w}], w)
           st == L0.sr[w.rk].st
       IN IF st \in Draining
          THEN Commit(p, Settle(FireSR(L0, w.rk, "write_failed", st), w.rk))
          ELSE /\ CanFault("wfail")
               /\ Commit(p, Settle(FireSR(Faulted(L0), w.rk, "write_failed", "draining_failed"),
                                   w.rk))

\* The transport reports the cut connection, or its side of a one-sided loss.
SessionTransportLost(p) ==
    /\ (cut \/ p \in lost) /\ sess[p] \in Live
    /\ Commit(p, Die(FireS(Load(p, "SessionTransportLost"), "transport_lost", "dead"), sess[p]))

-----------------------------------------------------------------------------
(* Timers: each is enabled while armed; there is no clock. *)

SessionTimerHandshake(p) ==
    /\ sess[p] \in PreReady /\ CanFault("hstimer")
    /\ Commit(p, Die(Send(FireS(Faulted(Load(p, "SessionTimerHandshake")), "timer_handshake", "ended"),
                         Ctl("disconnect")), sess[p]))

ClientRoundTimerLoad(p) ==
    \E k \in DOMAIN cr[p] : Timer("load") /\
       /\ cr[p][k].st \in {"queued", "loading"}
       /\ LET L == Load(p, "ClientRoundTimerLoad") IN
          Commit(p, IF cr[p][k].st = "queued" THEN RetireLoad(L, k, "timer_load")
                    ELSE AbortLoad(L, k, "timer_load"))

\* Re-send the abort (bounded by MaxAborts frames of this round in flight); under a
\* profile that ends the session on a missing abort_ack (ackEnds), end it instead.
\* BugP5: give up instead, fail the job and free its destination (vLLM G1-G4).
CanResend(p, k) ==
    /\ Timer("abort_ack")
    /\ cr[p][k].st \in {"aborting", "reported"}
    /\ \/ BugP5
       \/ PB.ackEnds
       \/ CountRound(chan[p] \o queue[p], "abort_fetch", k[1], k[2])
          + CountRound(chan[Other(p)] \o queue[Other(p)], "abort_ack", k[1], k[2]) < MaxAborts

ClientRoundTimerAbortAck(p) ==
    \E k \in DOMAIN cr[p] :
       /\ CanResend(p, k)
       /\ LET L == Load(p, "ClientRoundTimerAbortAck") IN
          Commit(p, IF BugP5 /\ L.cr[k].st = "aborting"
                       THEN Complete(L, k, "timer_abort_ack", "aborted", "fail", 0)
                       ELSE IF PB.ackEnds
                       THEN Die(Send(FireS(FireCR(L, k, "timer_abort_ack", L.cr[k].st),
                                           "abort_ack_expired", "ended"), Ctl("disconnect")),
                                L.sess)
                       ELSE SendAbort(FireCR(L, k, "timer_abort_ack", L.cr[k].st), k))

\* The peer's writes into the destinations a session that is over holds are proven over
\* (PeerGone: its data-plane agent gone and its transfers ended; the spec's proof is
\* that the peer's session is over too, so it starts no write, and none of its writes
\* in flight targets a held destination). Every held destination is released.
\* BugReleaseEarly: released at the session's end whatever the peer still writes.
WritesOver(p, j) == sess[Other(p)] \notin Live /\ \A w \in wr[Other(p)] : w.dst # j
HeldJobs(p) == {cr[p][k].job : k \in {x \in DOMAIN cr[p] : cr[p][x].st = "orphaned"}}

ClientRoundPeerGone(p) ==
    /\ "gone" \in S.faults /\ sess[p] \notin Live /\ HeldJobs(p) # {}
    /\ BugReleaseEarly \/ \A j \in HeldJobs(p) : WritesOver(p, j)
    /\ Commit(p, ReleaseHeld(Load(p, "ClientRoundPeerGone")))

\* The host's bounded hold of one held destination ends (a profile with a hold). The
\* host vouches that no write of the lost peer outlives the hold: the spec lets it fire
\* only once that is so (WritesOver); BugReleaseEarly drops that bound.
ClientRoundTimerHold(p) ==
    \E k \in DOMAIN cr[p] :
       /\ PB.hold /\ Timer("hold") /\ cr[p][k].st = "orphaned"
       /\ BugReleaseEarly \/ WritesOver(p, cr[p][k].job)
       /\ Commit(p, Release(Load(p, "ClientRoundTimerHold"), k, "timer_hold", 0))

\* probing: all-MISS and wait one more period for a late answer; expired: stop waiting.
\* Under a profile that ends the session on an overdue answer (lookupEnds), a probing
\* lookup's deadline ends the session instead; its session_lost reports the lookup.
ClientLookupTimerLookup(p) ==
    \E req \in Reqs : \E i \in 1 .. Len(cl[p][req]) : Timer("lookup") /\
       LET L == Load(p, "ClientLookupTimerLookup") IN
       Commit(p, IF L.cl[req][i].st = "probing" /\ PB.lookupEnds
                 THEN Die(Send(FireS(Fire(L, "client_lookup", "timer_lookup", "probing",
                                          "probing"), "lookup_expired", "ended"),
                               Ctl("disconnect")), L.sess)
                 ELSE IF L.cl[req][i].st = "probing"
                 THEN Fire([L EXCEPT !.cl[req][i].st = "expired", !.nlr = @ + 1],
                           "client_lookup", "timer_lookup", "probing", "expired")
                 ELSE Fire([L EXCEPT !.cl[req] = Without(@, i)],
                           "client_lookup", "timer_lookup", "expired", "discarded"))

ServerRoundTimerStore(p) ==
    \E k \in DOMAIN sr[p] : Timer("store") /\
       /\ sr[p][k].st \in {"supplied", "supply_closed", "pinned", "pinned_closed"}
       /\ LET L == Load(p, "ServerRoundTimerStore")
              R == L.sr[k]
              \* ServerRound.remember_expired: the late fetch of expired pins fails fast.
              L1 == IF R.st \in {"pinned", "pinned_closed"} THEN [L EXCEPT !.xl[k[1]] = R.seq]
                    ELSE L
          IN Commit(p, EndRound(FireSR(L1, k, "timer_store", "done"), k))

\* The producer's demand deadline (armed by a servable fetch, never disarmed before the
\* round ends, so it may also fire while the round drains, even after session death).
ServerRoundTimerDemand(p) ==
    \E k \in DOMAIN sr[p] : Timer("demand") /\
       /\ sr[p][k].st \in {"serving", "finishing"} \cup Draining /\ sr[p][k].dtm
       /\ LET L == [Load(p, "ServerRoundTimerDemand") EXCEPT !.sr[k].dtm = FALSE]
              st == L.sr[k].st
          IN Commit(p, Settle(FireSR(L, k, "timer_demand",
                                     IF st \in Draining THEN st ELSE "draining_failed"), k))

ServerLookupTimerLookupPending(p) ==
    \E req \in Reqs : \E i \in 1 .. Len(sl[p][req]) : Timer("lookup_pending") /\
       \E how \in Parts :
       Commit(p, SettleLookups(Fire([Load(p, "ServerLookupTimerLookupPending") EXCEPT !.sl[req][i].pending = {}],
                                    "server_lookup", "timer_lookup_pending",
                                    "resolving", "resolving"), req, how))

-----------------------------------------------------------------------------
(* Network faults (SimWorld.cut, drop, duplicate) *)

NetworkCut ==
    /\ ~cut /\ CanFault("cut")
    /\ cut' = TRUE
    /\ faults' = faults + 1
    /\ chan' = [p \in Peers |-> <<>>]
    /\ fired' = {}
    /\ act' = IF TrackAct THEN <<"NetworkCut", "">> ELSE <<"", "">>
    /\ UNCHANGED <<scn, peerVars, lost, compat, gone, perr>>

\* A frame p sent is lost. Fault "drop": any frame. Fault "ackloss": only a consumer's
\* connect_ack to a peer that took its connect already, as ZeroMQ's ROUTER_HANDOVER loses
\* what an established connection of a peer whose routing id was taken over still had
\* in flight (docs/explanation/reliability.md).
NetworkDrop(p) ==
    /\ chan[p] # <<>>
    /\ \/ CanFault("drop")
       \/ /\ CanFault("ackloss") /\ p \in LoadPeers /\ Peek(chan[p])[1] = "connect_ack"
          /\ sess[Other(p)] \in {"registering", "awaiting_ack"}
    /\ chan' = [chan EXCEPT ![p] = Rest(@)]
    /\ faults' = faults + 1
    /\ fired' = {}
    /\ act' = IF TrackAct THEN <<"NetworkDrop", p>> ELSE <<"", "">>
    /\ UNCHANGED <<scn, peerVars, cut, lost, compat, gone, perr>>

NetworkDuplicate(p) ==
    /\ chan[p] # <<>> /\ Peek(chan[p])[1] \in DupTypes /\ CanFault("dup")
    /\ chan' = [chan EXCEPT ![p] = Append(@, Peek(@))]
    /\ faults' = faults + 1
    /\ fired' = {}
    /\ act' = IF TrackAct THEN <<"NetworkDuplicate", p>> ELSE <<"", "">>
    /\ UNCHANGED <<scn, peerVars, cut, lost, compat, gone, perr>>

\* A fetch p sent arrives malformed but still naming its round (a buggy consumer: its
\* lengths differ, an index lies outside the region, its keys are a string).
NetworkCorrupt(p) ==
    /\ chan[p] # <<>> /\ Peek(chan[p])[1] = "fetch" /\ Peek(chan[p])[4] # {}
    /\ CanFault("corrupt")
    /\ chan' = [chan EXCEPT ![p] = <<[Peek(@) EXCEPT ![1] = "bad_fetch"]>> \o Rest(@)]
    /\ faults' = faults + 1
    /\ fired' = {}
    /\ act' = IF TrackAct THEN <<"NetworkCorrupt", p>> ELSE <<"", "">>
    /\ UNCHANGED <<scn, peerVars, cut, lost, compat, gone, perr>>

\* A one-sided loss: p's transport decides the connection is lost (its heartbeat expired,
\* as after a freeze that ends right at the heartbeat timeout) while the other side's
\* does not; frames still flow both ways (p's node dials back to answer). p's session
\* then learns of it (SessionTransportLost); the other's stays live and is told only by
\* the disconnect p's dead session answers its frames with (SessionRecvStale).
NetworkHalfCut(p) ==
    /\ ~cut /\ lost = {} /\ CanFault("halfcut")
    /\ sess[p] \in Live /\ sess[Other(p)] \in Live
    /\ lost' = {p}
    /\ faults' = faults + 1
    /\ fired' = {}
    /\ act' = IF TrackAct THEN <<"NetworkHalfCut", p>> ELSE <<"", "">>
    /\ UNCHANGED <<scn, peerVars, chan, cut, compat, gone, perr>>

\* A frame lifetime passes (Timeouts.tombstone, purged in Session.handle): a tombstone
\* is forgotten once no frame it guards against can still arrive. The sessions assume
\* that a frame arrives within its lifetime or never; this action encodes exactly that.
NetworkFrameLifetime(p) ==
    \E req \in Reqs :
       LET all == chan[p] \o queue[p] \o chan[Other(p)] \o queue[Other(p)]
           InFlight(ts, ss) == \E i \in 1 .. Len(all) :
                                   all[i][1] \in ts /\ all[i][2] = req /\ all[i][3] \in ss
           floorGone == fl[p][req] > 0
                        /\ ~InFlight({"abort_fetch", "abort_ack"}, 0 .. fl[p][req] - 1)
           xlGone == xl[p][req] # Unbound /\ ~InFlight({"fetch"}, {xl[p][req]})
           \* Session._finished forgets the host's finish after the same lifetime, timed
           \* from the finish, whatever is in flight by then.
           finGone == req \in fin[p] /\ "finlife" \in S.faults
           \* So does Session._peer_finished, timed from the terminal fetch.
           pfGone == req \in pf[p] /\ "finlife" \in S.faults
       IN /\ floorGone \/ xlGone \/ finGone \/ pfGone
          /\ fl' = [fl EXCEPT ![p][req] = IF floorGone THEN 0 ELSE @]
          /\ xl' = [xl EXCEPT ![p][req] = IF xlGone THEN Unbound ELSE @]
          /\ fin' = [fin EXCEPT ![p] = IF finGone THEN @ \ {req} ELSE @]
          /\ pf' = [pf EXCEPT ![p] = IF pfGone THEN @ \ {req} ELSE @]
          /\ fired' = {}
          /\ act' = IF TrackAct THEN <<"NetworkFrameLifetime", p>> ELSE <<"", "">>
          /\ UNCHANGED <<scn, sess, reg, queue, cr, lr, cl, nlk, nlr, nfin, sr, sl, wr,
                         lres, sres, netVars, gone, perr>>

\* A peer's process is killed and started again on the same address before its peer
\* noticed (no cut: the old connection looks alive). The new process has a fresh
\* session that has sent its connect, carrying incarnation 1, behind whatever the old
\* process had sent. The old process's jobs end with it (loads orphaned: their blocks
\* are gone; pins released), its writes stop, and frames to it are lost; so is what the
\* peer sends until it learns of the restart (gone: a new process never reads the old
\* connection). The peer must end its session on that connect, every job of it with one
\* result, and nothing of the old incarnation reaches the new one.
NetworkRestart(p) ==
    /\ ~cut /\ gone = {} /\ CanFault("restart")
    /\ sess[p] \in Live /\ sess[Other(p)] \in Live \ {"connecting"}
    /\ sess' = [sess EXCEPT ![p] = "connecting"]
    /\ reg' = [reg EXCEPT ![p] = FALSE]
    /\ queue' = [queue EXCEPT ![p] = <<>>]
    /\ cr' = [cr EXCEPT ![p] = <<>>]
    /\ fl' = [fl EXCEPT ![p] = [q \in Reqs |-> 0]]
    /\ xl' = [xl EXCEPT ![p] = [q \in Reqs |-> Unbound]]
    /\ lr' = [lr EXCEPT ![p] = [q \in Reqs |-> Unbound]]
    /\ cl' = [cl EXCEPT ![p] = [q \in Reqs |-> <<>>]]
    /\ nlr' = [nlr EXCEPT ![p] = nlk[p]]
    /\ fin' = [fin EXCEPT ![p] = {}]
    /\ pf' = [pf EXCEPT ![p] = {}]
    /\ sr' = [sr EXCEPT ![p] = <<>>]
    /\ sl' = [sl EXCEPT ![p] = [q \in Reqs |-> <<>>]]
    /\ wr' = [wr EXCEPT ![p] = {}]
    /\ lres' = [lres EXCEPT ![p] = [j \in DOMAIN @ |->
                    IF @[j].r \in {"pending", "orphan"} THEN [@[j] EXCEPT !.r = "lost"]
                    ELSE @[j]]]
    /\ sres' = [sres EXCEPT ![p] = [j \in DOMAIN @ |->
                    IF @[j].st = "pinned" THEN [@[j] EXCEPT !.st = "released"] ELSE @[j]]]
    /\ chan' = [x \in Peers |-> IF x = p
                                THEN Append(chan[p], Msg("connect", NoReq, Unbound, {},
                                                         Restarted, FALSE, {}))
                                ELSE <<>>]
    /\ gone' = {Other(p)}
    /\ faults' = faults + 1
    /\ fired' = {}
    /\ act' = IF TrackAct THEN <<"NetworkRestart", p>> ELSE <<"", "">>
    /\ UNCHANGED <<scn, nlk, nfin, cut, lost, compat, perr>>

-----------------------------------------------------------------------------
(* The specification *)

Init ==
    /\ scn \in DOMAIN Scenarios
    /\ compat \in IF "incompat" \in Scenarios[scn].faults /\ MaxFaults > 0
                  THEN BOOLEAN ELSE {TRUE}
    /\ faults = IF compat THEN 0 ELSE 1
    /\ sess = [p \in Peers |-> IF Scenarios[scn].ready THEN "ready" ELSE "idle"]
    /\ reg = [p \in Peers |-> Scenarios[scn].ready]
    /\ queue = [p \in Peers |-> <<>>]
    /\ chan = [p \in Peers |-> <<>>]
    /\ cut = FALSE
    /\ lost = {}
    /\ cr = [p \in Peers |-> <<>>]
    /\ fl = [p \in Peers |-> [q \in Reqs |-> 0]]
    /\ xl = [p \in Peers |-> [q \in Reqs |-> Unbound]]
    /\ lr = [p \in Peers |-> [q \in Reqs |-> Unbound]]
    /\ cl = [p \in Peers |-> [q \in Reqs |-> <<>>]]
    /\ nlk = [p \in Peers |-> 0]
    /\ nlr = [p \in Peers |-> 0]
    /\ nfin = [p \in Peers |-> 0]
    /\ fin = [p \in Peers |-> {}]
    /\ pf = [p \in Peers |-> {}]
    /\ sr = [p \in Peers |-> <<>>]
    /\ sl = [p \in Peers |-> [q \in Reqs |-> <<>>]]
    /\ wr = [p \in Peers |-> {}]
    /\ lres = [p \in Peers |-> <<>>]
    /\ sres = [p \in Peers |-> <<>>]
    /\ perr = FALSE
    /\ gone = {}
    /\ fired = {}
    /\ act = <<"", "">>

NextHost(p) ==
    \/ SessionHostStart(p)
    \/ SessionHostClose(p)
    \/ ClientRoundHostFetch(p)
    \/ ClientLookupHostLookup(p)
    \/ ServerRoundHostSupply(p)
    \/ ServerLookupHostAnswer(p)
    \/ ServerRoundHostDecline(p)
    \/ ClientRoundHostFinish(p)

ReceiveActions ==
    {"NetworkDiscard", "SessionRecvStale", "SessionRecvConnect", "SessionRecvConnectAck", "SessionRecvDisconnect",
     "SessionRecvBadFetch", "ServerRoundRecvFetch", "ServerRoundRecvTerminalFetch", "ServerLookupRecvLookup",
     "ServerRoundRecvAbortFetch", "ClientRoundRecvTransferDone", "ClientRoundRecvAbortAck",
     "ClientLookupRecvLookupResp"}

NextReceive(p) ==
    \/ NetworkDiscard(p)
    \/ SessionRecvStale(p)
    \/ SessionRecvConnect(p)
    \/ SessionRecvConnectAck(p)
    \/ SessionRecvDisconnect(p)
    \/ SessionRecvBadFetch(p)
    \/ ServerRoundRecvFetch(p)
    \/ ServerRoundRecvTerminalFetch(p)
    \/ ServerLookupRecvLookup(p)
    \/ ServerRoundRecvAbortFetch(p)
    \/ ClientRoundRecvTransferDone(p)
    \/ ClientRoundRecvAbortAck(p)
    \/ ClientLookupRecvLookupResp(p)

NextExecutor(p) ==
    \/ ClientRoundPeerGone(p)
    \/ SessionRegistrationDone(p)
    \/ SessionRegistrationFailed(p)
    \/ ServerRoundWriteDone(p)
    \/ ServerRoundWriteFailed(p)
    \/ SessionTransportLost(p)

NextTimer(p) ==
    \/ SessionTimerHandshake(p)
    \/ ClientRoundTimerLoad(p)
    \/ ClientRoundTimerAbortAck(p)
    \/ ClientRoundTimerHold(p)
    \/ ClientLookupTimerLookup(p)
    \/ ServerRoundTimerStore(p)
    \/ ServerRoundTimerDemand(p)
    \/ ServerLookupTimerLookupPending(p)

NextNetwork ==
    \/ NetworkCut
    \/ \E p \in Peers : NetworkDrop(p)
    \/ \E p \in Peers : NetworkDuplicate(p)
    \/ \E p \in Peers : NetworkHalfCut(p)
    \/ \E p \in Peers : NetworkCorrupt(p)
    \/ \E p \in Peers : NetworkFrameLifetime(p)
    \/ \E p \in Peers : NetworkRestart(p)

Next ==
    \/ \E p \in Peers : NextHost(p) \/ NextReceive(p) \/ NextExecutor(p) \/ NextTimer(p)
    \/ NextNetwork

\* Weak fairness on everything but the hosts' requests and the faults: hosts open their
\* sessions, frames are delivered, registrations and writes finish, armed timers fire.
\* Few groups rather than one WF per action: TLC expands the negated implication into
\* a disjunctive normal form with 2^(number of WF conjuncts) terms. A group's members
\* cannot keep each other busy forever (a receive consumes a frame, a write or a timer
\* ends or advances its instance, and re-sent aborts are bounded by the frames in
\* flight), except re-sent aborts, which get a group of their own so that they
\* starve no other timer, and receives: each peer's delivery is a group of its own,
\* since a peer re-sending its abort to a session that is gone (one-sided loss) keeps
\* the other's receives busy for ever, which one group would let starve the frame
\* that ends it (the dead side's disconnect).
FairReceive(p) == NextReceive(p)
FairSession == \E p \in Peers : SessionHostStart(p) \/ SessionRegistrationDone(p)
                                \/ SessionTransportLost(p)
FairWrites == \E p \in Peers : ServerRoundWriteDone(p) \/ ServerRoundWriteFailed(p)
FairTimers == \E p \in Peers : \/ SessionTimerHandshake(p)
                               \/ ClientRoundTimerLoad(p)
                               \/ ClientLookupTimerLookup(p)
                               \/ ServerRoundTimerStore(p)
                               \/ ServerRoundTimerDemand(p)
                               \/ ServerLookupTimerLookupPending(p)
FairResend == \E p \in Peers : ClientRoundTimerAbortAck(p)
SessionActions == {"SessionHostStart", "SessionRegistrationDone", "SessionTransportLost"}
WriteActions == {"ServerRoundWriteDone", "ServerRoundWriteFailed"}
TimerActions == {"SessionTimerHandshake", "ClientRoundTimerLoad", "ClientLookupTimerLookup",
                 "ServerRoundTimerStore", "ServerRoundTimerDemand",
                 "ServerLookupTimerLookupPending"}
ResendActions == {"ClientRoundTimerAbortAck"}

\* When each group is enabled, as plain state predicates (exactly ENABLED of the group;
\* tests/conformance checks them against TLC's own ENABLED on the live graph).
EnReceive(p) == chan[Other(p)] # <<>>
EnSession == \E p \in Peers : \/ sess[p] \in {"idle", "registering", "registering_acked"}
                              \/ (cut \/ p \in lost) /\ sess[p] \in Live
EnWrites == \E p \in Peers : wr[p] # {}
EnTimers ==
    \E p \in Peers :
        \/ sess[p] \in PreReady /\ CanFault("hstimer")
        \/ Timer("load") /\ \E k \in DOMAIN cr[p] : cr[p][k].st = "loading"
        \/ Timer("lookup") /\ \E q \in Reqs : cl[p][q] # <<>>
        \/ Timer("store") /\ \E k \in DOMAIN sr[p] :
               sr[p][k].st \in {"supplied", "supply_closed", "pinned", "pinned_closed"}
        \/ Timer("demand") /\ \E k \in DOMAIN sr[p] :
               sr[p][k].st \in {"serving", "finishing"} \cup Draining /\ sr[p][k].dtm
        \/ Timer("lookup_pending") /\ \E q \in Reqs : sl[p][q] # <<>>
EnResend == \E p \in Peers : \E k \in DOMAIN cr[p] : CanResend(p, k)

\* WF_vars(A) = []<>~ENABLED A \/ []<><<A>>_vars, spelled out for each group with cheap
\* parts: ENABLED as the predicates above, and A's steps recognized by the action name
\* they record in `act` (TrackAct). TLC 2.15 evaluates ENABLED and action predicates
\* of these LET-heavy actions so slowly in liveness checking that a few hundred states
\* take minutes; it also rejects the formula behind an operator with action arguments.
Fairness ==
    /\ \A p \in Peers : []<>(~EnReceive(p)) \/ []<><<act'[1] \in ReceiveActions /\ act'[2] = p>>_vars
    /\ []<>(~EnSession) \/ []<><<act'[1] \in SessionActions>>_vars
    /\ []<>(~EnWrites) \/ []<><<act'[1] \in WriteActions>>_vars
    /\ []<>(~EnTimers) \/ []<><<act'[1] \in TimerActions>>_vars
    /\ []<>(~EnResend) \/ []<><<act'[1] \in ResendActions>>_vars

Spec == Init /\ [][Next]_vars
\* Fairness reads `act`: check FairSpec with TrackAct = TRUE (live.cfg).
FairSpec == Spec /\ Fairness

-----------------------------------------------------------------------------
(* Safety properties (docs/explanation/verification.md lists each and what backs it) *)

Released(p, j) == lres[p][j].r \in {"ok", "fail", "freed"}

\* Every submitted load job gets exactly one result: never two, and while it has
\* none an open round still owns it (vLLM P3 dropped the round instead). A result with
\* its destination held is followed by exactly one release: until then a round holds
\* the job ("reported" or "orphaned"), and no job is released twice.
OneLoadResultInv ==
    \A p \in Peers : \A j \in 1 .. Len(lres[p]) :
        /\ lres[p][j].r # "twice"
        /\ lres[p][j].r = "pending" => \E k \in DOMAIN cr[p] : cr[p][k].job = j
        /\ lres[p][j].r = "orphan" =>
               \E k \in DOMAIN cr[p] : cr[p][k].job = j /\ cr[p][k].st \in Holding

\* Every store job gets exactly one result; while it has none exactly one round pins it.
OneStoreResultInv ==
    \A p \in Peers : \A j \in 1 .. Len(sres[p]) :
        /\ sres[p][j].st # "twice"
        /\ sres[p][j].st = "pinned" => Cardinality({k \in DOMAIN sr[p] : j \in sr[p][k].jobs}) = 1

\* A terminal frame (transfer_done, abort_ack) completes only the round that asked for
\* it: the ghost job it echoes is the job of the round it completed (vLLM P4).
TerminalFrameInv ==
    \A p \in Peers : \A j \in 1 .. Len(lres[p]) : lres[p][j].by \in {0, j}

\* One round never holds another round's pins (vLLM P1): a lookup pin taken for round
\* s sits in round s.
RoundIsolationInv ==
    \A p \in Peers : \A k \in DOMAIN sr[p] : \A j \in sr[p][k].jobs :
        sres[p][j].rnd \in {Unbound, sr[p][k].seq}

\* A destination block is never reported free while a write to it may still land (P5).
NoFreeWhileWriteInv ==
    \A p \in Peers : \A w \in wr[p] : ~Released(Other(p), w.dst)

\* A pinned source block is never released while a write reads it (P6).
NoUnpinWhileReadInv ==
    \A p \in Peers : \A w \in wr[p] : \A j \in w.jobs : sres[p][j].st = "pinned"

\* No write before the peer's memory is registered, or outside the blocks the peer
\* allocated for the load the fetch came from. Per region: a block may be a slice in each
\* of several regions (a cache laid out per layer); the peer's regions are registered
\* together (one StartRegistration, one RegistrationFinished), so reg[p] stands for every
\* one of them and w.dst for the block's slice in each, and peers whose regions do not
\* pair up are incompatible (compat), never ready. Where each slice lies in its region,
\* byte for byte, is the data plane's: tests/unit/test_layout.py.
WriteTargetInv ==
    \A p \in Peers : \A w \in wr[p] :
        /\ reg[p]
        /\ w.dst \in 1 .. Len(lres[Other(p)])
        /\ w.keys # {}

\* Nothing but connect/connect_ack/disconnect goes on the wire before the session is
\* ready, and nothing stays queued once it is.
SendGatingInv ==
    \A p \in Peers :
        /\ \A i \in 1 .. Len(chan[p]) : chan[p][i][8]
        /\ sess[p] = "ready" => queue[p] = <<>>

\* Two conformant peers never make each other reject a request or a response, unless
\* the network lost a frame or made one malformed.
NoProtocolErrorInv == perr => S.faults \cap {"drop", "corrupt"} # {}

\* Every lookup gets at most one result.
OneLookupResultInv == \A p \in Peers : nlr[p] <= nlk[p]

-----------------------------------------------------------------------------
(* Liveness properties, under Fairness *)

MaxJobs == Max({Scenarios[i].loads : i \in DOMAIN Scenarios}
               \cup {Scenarios[i].stores : i \in DOMAIN Scenarios}
               \cup {Scenarios[i].lookups : i \in DOMAIN Scenarios})

\* Every load job ends.
LoadsEndProp ==
    \A p \in Peers : \A j \in 1 .. MaxJobs :
        (j <= Len(lres[p]) /\ lres[p][j].r = "pending")
            ~> (j <= Len(lres[p]) /\ lres[p][j].r # "pending")

\* Every pin is released.
PinsReleasedProp ==
    \A p \in Peers : \A j \in 1 .. MaxJobs :
        (j <= Len(sres[p]) /\ sres[p][j].st = "pinned")
            ~> (j <= Len(sres[p]) /\ sres[p][j].st # "pinned")

\* Every lookup gets its result.
LookupsEndProp ==
    \A p \in Peers : \A n \in 1 .. MaxJobs : (nlk[p] >= n) ~> (nlr[p] >= n)

\* Every abort is acked (or raced by transfer_done) once the writes are quiet, unless
\* the session goes away.
AbortsEndProp ==
    \A p \in Peers : \A k \in CKeys :
        (k \in DOMAIN cr[p] /\ cr[p][k].st = "aborting")
            ~> ~(k \in DOMAIN cr[p] /\ cr[p][k].st = "aborting")

\* Every serve round ends (no round stays open once its writes are quiescent).
RoundsEndProp ==
    \A p \in Peers : \A k \in SKeys : (k \in DOMAIN sr[p]) ~> (k \notin DOMAIN sr[p])
=============================================================================
