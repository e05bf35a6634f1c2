"""Where the input table (``models/inputs.toml``) sends one frame: its route.

The dispatch (:mod:`~p2pfsm.session.dispatch`) builds one :class:`Route` per frame row
and trigger at import and hands it to the part that takes the frame, so no part spells
a gate or a trigger of the table again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    """A frame's route: the session trigger every such frame passes first (``gate``,
    checked by the dispatch and fired by the part once it validated the frame) and the
    trigger it fires on its own machine (``trigger``, the row's variant for this frame)."""

    gate: str
    trigger: str
