"""The inventory service's store: a SQLite database at $INVENTORY_DB (in production,
/var/lib/inventory/store.db), outside the repository."""

import os
import sqlite3


def connect() -> sqlite3.Connection:
    return sqlite3.connect(os.environ["INVENTORY_DB"])


def stock(item: str) -> int:
    """How many of ``item`` are in stock."""
    with connect() as db:
        row = db.execute("SELECT qty FROM stock WHERE item = ?", (item,)).fetchone()
    return row[0] if row else 0
