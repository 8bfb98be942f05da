"""A data root on disk: reading its meta.json and tokenizer, what a complete one holds, and the partial
folder a build works in until it is renamed into place (`.<root>.partial`, locked by the building
process's pid, kept after an interruption so the next run with the same settings resumes it)."""
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Union

from mindvl import preprocess as P
from mindvl.data.records import SPLITS, conversation_table
from mindvl.errors import ConfigError, DataRootError
from mindvl.files import pid_alive


def require_file(root: Path, name: str) -> Path:
    """root/name, or DataRootError saying how to build the root."""
    path = root / name
    if not path.is_file():
        raise DataRootError(f"data root {root}: {name} is missing; build the data set first with "
                            f"`mindvl data build --config <recipe>` (it writes to data.root)")
    return path


def load_meta(root: Union[str, Path]) -> Dict:
    """meta.json of a built data root: answers, questions, captions, voices, preprocess, counts."""
    return json.loads(require_file(Path(root), "meta.json").read_text())


def load_tokenizer(root: Union[str, Path]) -> P.TextTokenizer:
    """The data set's word tokenizer (`<root>/tokenizer.json`)."""
    return P.TextTokenizer.load(require_file(Path(root), "tokenizer.json"))


FORMAT_VERSION = 5  # 3: the conversation tables; 4: "pair" conversations (two images); 5: a pair's other image id
# files every complete root holds; the split tables are listed in meta.json "tables" (see is_complete)
DATA_FILES = ("tokenizer.json", "meta.json", "card.json", "report.json", "quarantine.jsonl",
              "speech.mindrecord", "speech.mindrecord.db")
PARTIAL_STATE = (".done", ".lock", ".settings.json")  # bookkeeping of a partial build, removed at the end


def is_complete(root: Union[str, Path]) -> bool:
    """True when `root` holds every file a finished build writes (DATA_FILES and every table in meta.json)."""
    root = Path(root)
    if not all((root / name).is_file() for name in DATA_FILES):
        return False
    try:
        tables = json.loads((root / "meta.json").read_text())["tables"]
        names = [name for split in SPLITS for table in (split, conversation_table(split)) for name in tables[table]]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((root / name).is_file() and (root / f"{name}.db").is_file() for name in names)


def check_replaceable(root: Path) -> None:
    """Refuse to replace a folder that is not a (possibly partial) mindvl data root."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"data.root: {root} exists and is not a folder; choose another data.root")
    if root.is_dir() and any(root.iterdir()) and not any((root / name).exists()
                                                         for name in ("report.json", "meta.json")):
        raise ConfigError(f"data.root: {root} is a non-empty folder that is not a mindvl data set; "
                          f"choose another data.root or empty it")


def partial_folder(root: Union[str, Path]) -> Path:
    """Where a build of `root` works until it renames the finished folder into place."""
    root = Path(root)
    return root.parent / f".{root.name}.partial"


def open_partial(root: Path, settings: Dict, force: bool) -> Path:
    """The partial folder, kept when an interrupted build with the same settings left it, else fresh."""
    work = partial_folder(root)
    lock = work / ".lock"
    if _alive_other(lock):
        raise ConfigError(f"data.root: another build (pid {lock.read_text()}) is writing {work}; "
                          f"wait for it or stop it")
    try:
        same = json.loads((work / ".settings.json").read_text()) == json.loads(json.dumps(settings))
    except (OSError, ValueError):
        same = False
    if force or not same:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(exist_ok=True)
    lock.write_text(str(os.getpid()))
    (work / ".settings.json").write_text(json.dumps(settings, indent=2))
    return work


def _alive_other(lock: Path) -> bool:
    """True when `lock` names a running process other than this one."""
    try:
        pid = int(lock.read_text())
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and pid_alive(pid)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()
