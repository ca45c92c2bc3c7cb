"""examples/sqlite_dataset.py (issue 36): from a fresh clone it writes its own SQLite database of
photos, loads it through conveyor.from_dataset, prints the batches' shapes and the GIL's share,
and checks that 1 and 4 workers give the same batches and that a mid-epoch state_dict resumes
bit-exactly (its exit status says whether both held)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys

from conftest import REPO

EXAMPLE = REPO / "examples" / "sqlite_dataset.py"


def test_the_sqlite_example_loads_its_own_database_the_same_for_any_workers(tmp_path):
    db = tmp_path / "photos.sqlite"
    done = subprocess.run([sys.executable, str(EXAMPLE), "--db", str(db), "--images", "40",
                           "--batch", "8", "--size", "32"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*), COUNT(DISTINCT cls) FROM photos").fetchone() == (40, 10)
    shapes = re.findall(r"^batch (\d+): image \((\d+), 3, 32, 32\) torch\.uint8, "
                        r"label \((\d+),\) torch\.int64$", done.stdout, re.M)
    assert [(int(s), int(n)) for s, n, m in shapes if n == m] == [(i, 8) for i in range(5)], \
        done.stdout
    gil = re.search(r"^GIL: held [\d.]+ ms in (\d+) calls \(\d+ us per sample\), "
                    r"[\d.]+% of the workers' time$", done.stdout, re.M)
    assert gil and int(gil[1]) >= 40, done.stdout
    assert "1 and 4 workers give identical batches: yes" in done.stdout
    assert "resumed after batch 1 from state_dict, bit-exact: yes" in done.stdout
