"""The calibration a device applies in an edge-cloud cascade (`Cascade.from_calibration`): the temperature
and threshold fitted by `mindvl lite calibrate` (mindvl/deploy/calibrate.py), read from its JSON file
(`calibration.json` beside the package's manifest, or anywhere). It records the package's vqa graph hash,
so it is never applied to another model.
"""
import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from mindvl.lite.lite_model import LiteError

CALIBRATION_FILE = "calibration.json"
FORMAT = "mindvl-calibration"
FORMAT_VERSION = 1
MODALITIES = ("typed", "spoken", "both")  # how each question is asked: text, WAV, or both at once

PathLike = Union[str, Path]


class CalibrationError(LiteError):
    """Calibration data or settings that cannot give a calibration, or a calibration file that cannot be
    used; the message says what to change."""


def identity_graph(manifest: dict) -> str:
    """The graph whose file a calibration is bound to: vqa, or a generative package's decode graph."""
    for graph in ("vqa", "decode"):
        if graph in manifest["graphs"]:
            return graph
    raise CalibrationError(f"package {manifest['name']}: has no vqa or decode graph to calibrate a cascade for")


def package_identity(manifest: dict) -> Dict[str, Any]:
    """What a calibration belongs to: the package's name, version and its vqa (or decode) graph file's hash."""
    graph = identity_graph(manifest)
    return {"name": manifest["name"], "version": manifest["version"],
            f"{graph}_sha256": manifest["files"][manifest["graphs"][graph]["file"]]["sha256"]}


@dataclasses.dataclass
class Calibration:
    """A fitted cascade setting and the evidence for it (see the module docstring)."""
    temperature: float
    threshold: float
    package: Dict[str, Any]
    target: Dict[str, float] = dataclasses.field(default_factory=dict)
    split: str = ""
    modality: str = ""
    examples: int = 0
    skipped: List[str] = dataclasses.field(default_factory=list)
    nll: Dict[str, float] = dataclasses.field(default_factory=dict)
    cloud: Dict[str, Any] = dataclasses.field(default_factory=dict)
    chosen: Dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    curve: List[Dict[str, Optional[float]]] = dataclasses.field(default_factory=list)
    created: str = ""
    # edge_ms / cloud_ms: median ms to answer one question alone (cloud_ms None when the cloud was not asked),
    # over `questions` questions; empty in a file written before it was measured
    latency: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **dataclasses.asdict(self)}

    def save(self, path: PathLike) -> Path:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.to_dict(), indent=2))
        except OSError as exc:
            raise CalibrationError(f"{path}: cannot write the calibration ({exc}); choose another --out") from exc
        return path

    def check_package(self, manifest: dict, package: PathLike) -> None:
        """CalibrationError unless this calibration was fitted for the package with `manifest`."""
        have = package_identity(manifest)
        key = f"{identity_graph(manifest)}_sha256"
        if have[key] != self.package.get(key):
            fitted = self.package
            theirs = next((f"{k[:-7]} sha256 {str(v)[:12]}" for k, v in fitted.items() if k.endswith("_sha256")), "")
            raise CalibrationError(f"the calibration was fitted for package {fitted.get('name')} v"
                                   f"{fitted.get('version')} ({theirs}), not {package} ({have['name']} "
                                   f"v{have['version']}, {key[:-7]} sha256 {have[key][:12]}); run `mindvl lite "
                                   f"calibrate {package}` for it")


def load_calibration(path: PathLike) -> Calibration:
    """A calibration file, or the calibration.json inside a package folder."""
    path = Path(path)
    if path.is_dir():
        path = path / CALIBRATION_FILE
    if not path.is_file():
        raise CalibrationError(f"{path}: no such calibration file; write one with `mindvl lite calibrate PKG "
                               f"--data ROOT`")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise CalibrationError(f"{path}: not valid JSON ({exc}); calibrate again") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        raise CalibrationError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} file; calibrate again with this mindvl")
    fields = {f.name for f in dataclasses.fields(Calibration)}
    try:
        calibration = Calibration(**{k: v for k, v in data.items() if k in fields})
    except TypeError as exc:
        raise CalibrationError(f"{path}: {exc}; calibrate again") from exc
    if not (isinstance(calibration.temperature, (int, float)) and calibration.temperature > 0 and
            isinstance(calibration.threshold, (int, float)) and calibration.threshold >= 0):
        raise CalibrationError(f"{path}: temperature {calibration.temperature!r} / threshold "
                               f"{calibration.threshold!r}: expected a temperature > 0 and a threshold >= 0")
    return calibration


# ----------------------------------------------------------------------------- labelled questions

def example_item(example, modality: str) -> Dict[str, Any]:
    """A QueryExample as predict's inputs, the question typed, spoken or both."""
    if modality not in MODALITIES:
        raise CalibrationError(f"modality {modality!r}: expected one of {', '.join(MODALITIES)}")
    return {"image": example.image, "question": "" if modality == "spoken" else example.question,
            "audio": b"" if modality == "typed" else example.audio}
