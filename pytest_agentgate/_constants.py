"""Names shared by the plugin (which must import nothing heavy) and the engine."""

#: A file that marks a directory as the plugin's own workspace root: prune may remove such a
#: directory, and pytest never collects tests from it.
RUN_MARKER = ".agentgate-run"
