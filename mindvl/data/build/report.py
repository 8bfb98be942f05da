"""BuildReport: what a data build produced and dropped, printed by `mindvl data build` and kept as
`<root>/report.json` (a re-run with the same settings returns it instead of building again)."""
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from mindvl.data.build.cleaning import REASONS
from mindvl.data.records import SPLITS

SKIP_REASONS = tuple(REASONS)


@dataclass
class BuildReport:
    """What a build produced and dropped; also written as `<root>/report.json`."""

    root: str
    settings: Dict = field(default_factory=dict)
    counts: Dict[str, Dict[str, int]] = field(default_factory=dict)  # split -> {"images", "examples", ...}
    skips: Dict[str, int] = field(default_factory=dict)  # reason -> items dropped (units: REASONS)
    skips_by_split: Dict[str, Dict[str, int]] = field(default_factory=dict)  # split -> reason -> count (non-zero)
    voices: Dict[str, List[str]] = field(default_factory=dict)  # split -> voices used
    rates: Dict[str, List[int]] = field(default_factory=dict)  # split -> speech rates used (words/minute)
    quarantined: List[str] = field(default_factory=list)  # copies under quarantine/
    resampled: List[Dict] = field(default_factory=list)  # user clips at another rate: split, source, from, to
    alignment: Dict[str, Any] = field(default_factory=dict)  # scorer, threshold, score quantiles, dropped
    resumed: List[str] = field(default_factory=list)  # units reused from an interrupted build
    seconds: Dict[str, float] = field(default_factory=dict)  # stage -> wall seconds, and "total"
    already_built: bool = False

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict) -> "BuildReport":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def summary(self) -> str:
        """A table of what each split kept and dropped (by reason, with the unit each reason counts)."""
        head = f"data root {self.root}" + (" (already built)" if self.already_built else "")
        if self.seconds.get("total"):
            head += f", built in {self.seconds['total']:.1f} s"
        rows: List[Tuple[str, List[Any]]] = []

        def row(label: str, key: str) -> None:
            rows.append((label, [self.counts.get(split, {}).get(key, 0) for split in SPLITS]))

        row("source images", "images")
        row("source examples", "source_examples")
        row("kept images", "images_used")
        row("kept examples", "examples")
        row("kept questions", "questions")
        row("kept captions", "captions")
        row("kept clips", "clips")
        row("conversations", "conversations")
        row("shards", "shards")
        dropped = [reason for reason in SKIP_REASONS if self.skips.get(reason)]
        if dropped:
            rows.append(("dropped:", []))
            for reason in dropped:
                rows.append((f"  {reason} ({REASONS[reason][0]}s)",
                             [self.skips_by_split.get(split, {}).get(reason, 0) for split in SPLITS]))
        width = max(len(label) for label, _ in rows)
        lines = [head, f"  {'':{width}}" + "".join(f"{split:>10}" for split in SPLITS)]
        lines += [(f"  {label:{width}}" + "".join(f"{v:>10}" for v in values)).rstrip() for label, values in rows]
        if not dropped:
            lines.append("  dropped: nothing")
        lines.append(f"  voices: train {self.voices.get('train')} at {self.rates.get('train')} wpm, "
                     f"test {self.voices.get('test')} at {self.rates.get('test')} wpm")
        if self.resampled:
            rates = sorted({r["from"] for r in self.resampled})
            lines.append(f"  resampled {len(self.resampled)} user clip(s) from {rates} Hz")
        if self.alignment:
            lines.append(f"  alignment: {self.alignment}")
        if self.resumed:
            lines.append(f"  resumed: reused {len(self.resumed)} finished unit(s) of an interrupted build")
        dropped_total = sum(self.skips.values())
        lines.append(f"  quarantine.jsonl: {dropped_total} record(s)"
                     + (f"; {len(self.quarantined)} file(s) copied to quarantine/" if self.quarantined else ""))
        return "\n".join(lines)


def read_report(root: Union[str, Path]) -> Optional[BuildReport]:
    path = Path(root) / "report.json"
    try:
        return BuildReport.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
