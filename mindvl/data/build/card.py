"""card.json: the dataset card of a data root (what it is, where it came from under which licence, what
was dropped, a sha256 per file), written last so it covers every file of the build."""
import dataclasses
import json
from pathlib import Path

from mindvl import preprocess as P
from mindvl.config import Config
from mindvl.data.build.report import BuildReport
from mindvl.data.build.source import SPLITS, Source
from mindvl.data.root import FORMAT_VERSION, PARTIAL_STATE
from mindvl.files import sha256_file
from mindvl.version import __version__

ESPEAK_LICENCE = {"name": "espeak-ng voices (espeakng-loader)", "license": "GPL-3.0-or-later",
                  "url": "https://github.com/espeak-ng/espeak-ng", "content": "synthesised spoken questions"}


def write_card(work: Path, cfg: Config, source: Source, report: BuildReport) -> None:
    """card.json: what the data set is, where it came from under which licence, and a sha256 per file."""
    files = {}
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        rel = path.relative_to(work).as_posix()
        if rel.split("/")[0] in PARTIAL_STATE or rel == "card.json":
            continue
        files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    sources = [*source.licences, {**ESPEAK_LICENCE, "voices": report.voices, "rates_wpm": report.rates}]
    card = {
        "name": f"mindvl data set from {source.name}",
        "format": FORMAT_VERSION,
        "mindvl_version": __version__,
        "sources": sources,
        "counts": {split: {k: report.counts[split][k] for k in ("examples", "images_used", "questions", "captions",
                                                                  "clips", "shards")} for split in SPLITS},
        "speech_clips": report.counts["speech"],
        "dropped": report.skips_by_split,
        "cleaning": dataclasses.asdict(cfg.data.cleaning),
        "preprocess": P.preprocess_dict(cfg.preprocess),
        "limit": report.settings.get("limit", 0),
        "build_seconds": report.seconds.get("total"),
        "files": files,
    }
    (work / "card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False))
