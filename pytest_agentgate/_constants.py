"""Names shared by the plugin (which must import nothing heavy) and the engine."""

#: The one place the version is written (the build reads it here; the package and the
#: command show it).
VERSION = "0.2.0"

#: A file that marks a directory as the plugin's own workspace root: prune may remove such a
#: directory, and pytest never collects tests from it.
RUN_MARKER = ".agentgate-run"

#: The marker of an agent task, and its line in ``pytest --markers``.
MARKER = "gated"
MARKER_HELP = (
    "gated(task, *, agent=None, gate=None, checks=(), protect=(), allow_removed=(), "
    "allow_changed=(), "
    "max_changed_lines=None, "
    "state=(), resume=None, retries=0, budget=None, resume_from=None, land=None): "
    "an agent task whose workspace (fixture agent_workspace) is snapshotted, gated by the "
    "test outcome, checks and gate commands, preflight-merged and promoted to the target"
)

# The defaults of the settings, each written once: the option table, the plugin's settings,
# the engine's settings and the command read them from here.
#: How long a server's lease on a branch lasts unless renewed (seconds).
DEFAULT_LEASE_S = 120.0
#: Most attempts one re-test of a merge lands together.
DEFAULT_BATCH_MAX = 8
#: Seconds a gate command may run.
DEFAULT_GATE_TIMEOUT_S = 600.0
#: Seconds a command an agent test runs in its workspace (``agent_workspace.run``) may run.
DEFAULT_RUN_TIMEOUT_S = 600.0
#: Seconds an agent command may run.
DEFAULT_AGENT_TIMEOUT_S = 3600.0
#: Run directories kept under a work directory.
DEFAULT_KEEP_RUNS = 3
#: Most files an attempt may change.
DEFAULT_MAX_FILES = 100_000
#: Most bytes an attempt may write (and its declared state hold).
DEFAULT_MAX_BYTES = 1 << 30
#: Most processes one command may run at once.
DEFAULT_PIDS_MAX = 512
#: The largest file one command may write.
DEFAULT_FILE_BYTES = 1 << 30

#: Paths never snapshotted (nor captured as state): secrets an agent might leave behind. A
#: pattern without a slash matches any component of a path, so ``.env`` also keeps out
#: everything in a ``.env/`` directory; a pattern with one matches the path or a parent.
DEFAULT_EXCLUDE = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "id_dsa*",
    ".netrc",
    ".pypirc",
    ".npmrc",
)

#: Whose tests judge an attempt's code unless told otherwise: the base's, in a session of
#: their own (see ``judge.base_tests``).
DEFAULT_TESTS_OF = "base"
#: The value of ``--agentgate-base`` that forks every agent of a run from the target as it
#: was when the run started (else each forks from the tip it finds).
RUN_START = "run-start"

# The choices of the settings that take one, each written once (the option table, the
# values they fill and the marker read them from here).
#: How contained commands run: bwrap when it works, bwrap required, or none.
SANDBOX_MODES = ("auto", "bwrap", "none")
#: How a passing attempt lands on a target that moved (``store.record.Landing`` spells the
#: same as a type).
LANDINGS = ("merge", "squash", "rebase")
#: How much of the base's object store an agent's ``.git`` can reach.
ISOLATIONS = ("shared", "sealed")
