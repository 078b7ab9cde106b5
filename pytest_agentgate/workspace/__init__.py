"""The agent's tree and the gate's clean trees.

Owns forking, snapshotting and recycling a workspace (``fork``), the gate's reused checkouts
(``checkouts``) and the declared state outside git that travels with an attempt (``state``).
May use: ``git``, ``sandbox`` and the shared modules.
"""
