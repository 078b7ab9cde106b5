"""Names shared by the plugin (which must import nothing heavy) and the engine."""

#: A file that marks a directory as the plugin's own workspace root: prune may remove such a
#: directory, and pytest never collects tests from it.
RUN_MARKER = ".agentgate-run"

#: The marker of an agent task, and its line in ``pytest --markers``.
MARKER = "gated"
MARKER_HELP = (
    "gated(task, *, agent=None, gate=None, checks=(), protect=(), allow_removed=(), "
    "max_changed_lines=None, "
    "state=(), resume=False, retries=0, budget=None, resume_from=None): "
    "an agent task whose workspace (fixture agent_workspace) is snapshotted, gated by the "
    "test outcome, checks and gate commands, preflight-merged and promoted to the target"
)
