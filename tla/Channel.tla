------------------------------ MODULE Channel ------------------------------
(***************************************************************************)
(* One direction of the control connection: a FIFO sequence of frames.    *)
(* The transport is ZeroMQ over TCP, so frames are never reordered or      *)
(* lost one by one; the whole connection can be cut (every frame in        *)
(* flight is lost, later sends vanish). The spec adds the faults of the    *)
(* simulated network: the head frame lost, or replayed at the tail.        *)
(* Models p2pfsm/executor/sim.py: SimWorld.deliver / duplicate / cut.      *)
(***************************************************************************)
EXTENDS Sequences, Naturals

\* The frame at the head, delivered next.
Peek(c) == Head(c)

\* The channel once its head has been consumed.
Rest(c) == Tail(c)

\* Append a frame unless the connection has been cut (the send is lost then).
Enqueue(c, m, isCut) == IF isCut THEN c ELSE Append(c, m)

\* Append a whole sequence (a flushed send queue), in order.
EnqueueAll(c, ms, isCut) == IF isCut THEN c ELSE c \o ms


\* How many frames of c have type t and name round (req, seq)
\* (a frame is a tuple <<type, kv_request_id, round_seq, ...>>).
RECURSIVE CountRound(_, _, _, _)
CountRound(c, t, req, seq) ==
    IF c = <<>> THEN 0
    ELSE (IF Head(c)[1] = t /\ Head(c)[2] = req /\ Head(c)[3] = seq THEN 1 ELSE 0)
         + CountRound(Tail(c), t, req, seq)
=============================================================================
