"""`mindvl export verify`: does the package still compute what the checkpoint computed?

Every listed file's sha256, then every graph loaded back with `mindspore.load` + `nn.GraphCell` (no
Python model code) and run on the stored samples; each output is compared with the output the
framework computed at export time: floats within |got - expected| <= atol + rtol * |expected|
(manifest "tolerance", 1e-4 and 1e-4), integer outputs (generated token ids) exactly.
"""
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

import mindspore as ms
import numpy as np

from mindvl.export.errors import PackageError
from mindvl.export.package import as_tuple, check_files, load_graph, load_samples, read_manifest


@dataclass
class OutputCheck:
    graph: str
    output: str
    max_abs_diff: float
    mismatched: int  # elements outside the tolerance
    ok: bool


@dataclass
class VerifyReport:
    package: str
    files: int
    checks: List[OutputCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def failures(self) -> List[OutputCheck]:
        return [check for check in self.checks if not check.ok]

    def to_dict(self) -> dict:
        return {"package": self.package, "ok": self.ok, "files": self.files,
                "checks": [asdict(check) for check in self.checks]}

    def summary(self) -> str:
        lines = [f"{self.package}: {self.files} files match their sha256"]
        for check in self.checks:
            state = "ok" if check.ok else f"MISMATCH ({check.mismatched} elements outside the tolerance)"
            lines.append(f"  {check.graph:<16} {check.output:<16} max |diff| {check.max_abs_diff:.2e}  {state}")
        lines.append("verified: every graph computes its stored outputs" if self.ok else
                     "FAILED: " + "; ".join(f"graph {c.graph} output {c.output}" for c in self.failures()))
        return "\n".join(lines)


def compare(graph: str, output: str, got: np.ndarray, expected: np.ndarray, tolerance: dict) -> OutputCheck:
    if got.shape != expected.shape:
        return OutputCheck(graph, output, float("inf"), int(expected.size), False)
    if np.issubdtype(expected.dtype, np.integer):
        bad = got != expected
        diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    else:
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        bad = ~(diff <= tolerance["atol"] + tolerance["rtol"] * np.abs(expected))  # NaN counts as bad
    return OutputCheck(graph, output, float(diff.max()) if diff.size else 0.0, int(bad.sum()), not bad.any())


def verify_package(package: Path, key: Optional[bytes] = None) -> VerifyReport:
    """Hashes, loading and stored samples of every graph; PackageError for a package that cannot be read."""
    package = Path(package)
    manifest = read_manifest(package)
    check_files(package, manifest)
    report = VerifyReport(str(package), len(manifest["files"]))
    for name, entry in manifest["graphs"].items():
        graph = load_graph(package, manifest, name, key)
        inputs, expected = load_samples(package, manifest, name)
        try:
            outputs = as_tuple(graph(*(ms.Tensor(value) for value in inputs.values())))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise PackageError(f"graph {name} ({entry['file']}): running the stored samples failed: "
                               f"{str(exc).strip().splitlines()[0]}") from exc
        for (output, want), got in zip(expected.items(), outputs):
            report.checks.append(compare(name, output, got.asnumpy(), want, manifest["tolerance"]))
    return report
