"""Resumable units of a data build: an interrupted build redoes only the units whose files or plan changed."""
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from mindvl.files import atomic_write, sha256_file


class ResumeUnit:
    """A resumable piece of the build: its files plus a done marker (.done/<name>.json) that records the
    digest of the plan it was written from and the sha256 of every file."""

    def __init__(self, work: Path, name: str, plan_digest: str, tables: List[str]) -> None:
        self.work, self.name, self.plan = work, name, plan_digest
        self.files = [f for table in tables for f in (table, f"{table}.db")]
        self.marker = work / ".done" / f"{name}.json"

    def finished(self) -> Optional[Dict]:
        """The marker, if this unit was finished from the same plan and its files are intact; else None."""
        try:
            done = json.loads(self.marker.read_text())
            if done["plan"] == self.plan and all(sha256_file(self.work / f) == done["files"][f]
                                                 for f in self.files):
                return done
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def finish(self, rows: int, payload: Dict) -> Dict:
        done = {"unit": self.name, "plan": self.plan, "rows": rows, "payload": payload,
                "files": {f: sha256_file(self.work / f) for f in self.files}}
        atomic_write(self.marker, lambda tmp: tmp.write_text(json.dumps(done)))
        return done


def plan_digest(plan: Any) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()
