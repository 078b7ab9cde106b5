"""The agent's tree and the gate's clean trees.

Owns forking a workspace (``fork``), snapshotting what the agent left (``snapshot``),
recycling a workspace for the next task (``recycle``) and whether reuse pays here
(``reuse``), the gate's reused checkouts
(``checkouts``) and the declared state outside git that travels with an attempt (``state``).
May use: ``store`` (where a state or a checkpoint is named and read back), ``git``,
``sandbox`` and the shared modules.
"""
