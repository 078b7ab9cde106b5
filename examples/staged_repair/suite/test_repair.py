"""The staged repair as a gated test: one agent command, checkpointed after each try."""

import os

import pytest

MODE = os.environ.get("REPAIR_RESUME", "full")
# The database's folder, not the file alone: SQLite writes its journal beside the database.
STATE = os.path.dirname(os.environ["INVENTORY_DB"])


@pytest.mark.gated(
    task="repair the inventory service",
    state=[STATE],
    retries=1,
    resume=MODE,
    # The repair is done when this test, failing on the base, passes.
    fail_to_pass=["tests/test_store.py::test_stock_is_counted_by_sku"],
)
def test_repair(agent_workspace):
    agent_workspace.run_agent()
    agent_workspace.checkpoint(f"after the agent's try {agent_workspace.attempt}")
