"""What both quickstarts print: stage headers and the summary table."""
from typing import Dict, List


def stage(text: str) -> None:
    print(f"\n== {text}", flush=True)


def nonzero(counts: Dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in counts.items() if count) or "none"


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def table(title: str, rows: List[List[str]]) -> str:
    width = max(len(r[0]) for r in rows)
    lines = ["", title, "-" * (width + 60)]
    lines += [f"{name.ljust(width)}  {value}" for name, value in rows]
    return "\n".join(lines)
