"""A scripted stand-in for an agent repairing the inventory service in two stages.

Stage one migrates the database (adds the ``sku`` column and fills it); stage two changes the
code to look stock up by SKU. Like the article's agents on this task, a first try gets through
stage one and stops; a later try only knows how to finish stage two, and that works only if
the database it finds is already migrated. Usage: agent.py WORKSPACE ATTEMPT
"""

import os
import pathlib
import sqlite3
import sys

workspace, attempt = pathlib.Path(sys.argv[1]), int(sys.argv[2])
db = sqlite3.connect(os.environ["INVENTORY_DB"])
if attempt == 1:
    db.execute("ALTER TABLE stock ADD COLUMN sku TEXT")
    db.execute("UPDATE stock SET sku = 'BOLT-M6' WHERE item = 'bolt'")
    db.commit()
    print("stage one: schema migrated; out of steps before the code change")
    sys.exit(0)
columns = [row[1] for row in db.execute("PRAGMA table_info(stock)")]
print(f"stage two: the database has columns {columns}")
store = workspace / "inventory" / "store.py"
store.write_text(
    store.read_text()
    + '''

def stock_by_sku(sku: str) -> int:
    """How many items with ``sku`` are in stock."""
    with connect() as db:
        row = db.execute("SELECT qty FROM stock WHERE sku = ?", (sku,)).fetchone()
    return row[0] if row else 0
'''
)
