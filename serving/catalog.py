"""Which servable versions are loaded, and the loads, switches and unloads that change it while requests run.

Readers take the current mapping without a lock; a load or unload builds a new mapping and swaps it in, so
a request sees the default version either before or after a switch, never half of one. A version in use
is closed only once its last request has finished: a request pinned to a version keeps getting it until
the version is unloaded, and none fails because of a switch. A gray release splits a servable's default
traffic between its loaded versions by weight (the MindSpore Serving guide's traffic split), sticky per client
key; the weights swap in whole like the mapping, so switching them under load loses no request.
"""
import asyncio
import contextlib
import hashlib
import logging
import math
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

from mindvl.serving.protocol import ProtocolError
from mindvl.serving.register import ServableError
from mindvl.serving.continuous_batching import GenerationOptions
from mindvl.serving.runtime import LoadedVersion, load_version
from mindvl.serving.servable import list_servables, list_versions

LOG = logging.getLogger("mindvl.serving")


def _fraction(text: str) -> float:
    """A fixed point of [0, 1) for a text (a client key): the same on every server and after restarts."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8], "big") / 2 ** 64


class NotAvailable(ProtocolError):
    """The servable or version asked for is not loaded (the message lists what is)."""


class Catalog:
    """The loaded versions of the servables in `servable_dir`, by name and version number."""

    def __init__(self, servable_dir: Path, key: Optional[bytes], max_batch: int,
                 generation: GenerationOptions = GenerationOptions()) -> None:
        self.servable_dir = Path(servable_dir)
        self.key = key
        self.max_batch = max_batch
        self.generation = generation  # generative versions' prefix caching and speculation
        self.loaded: Dict[str, Dict[int, LoadedVersion]] = {}  # replaced, never changed in place
        self.failed: Dict[Tuple[str, int], str] = {}  # versions that did not load, and why
        self.unloaded: Set[Tuple[str, int]] = set()  # unloaded on request: a refresh leaves them alone
        self.warnings: Set[str] = set()  # what the last refresh found wrong: each logged once, when it appears
        self.users: Dict[int, int] = {}  # id(LoadedVersion) -> requests using it
        self.loader = ThreadPoolExecutor(1, thread_name_prefix="load")  # one load at a time
        self.lock = asyncio.Lock()  # orders swaps with the loads and unloads that make them
        # gray release: each servable's version weights (set_traffic; replaced, never changed in place)
        self.traffic: Dict[str, Dict[int, float]] = {}
        self.routed: Callable[[str, int], None] = lambda name, version: None  # counts each answer's version

    # ---- requests -------------------------------------------------------------------------------------

    def get(self, name: str, version: int, client: Optional[str] = None) -> LoadedVersion:
        """The loaded version `version` of `name`; version 0: the default, which is the newest loaded unless the
        servable's traffic is split (set_traffic), then a version drawn by weight: the same one for every request
        of a `client` key while the weights stand."""
        versions = self.loaded.get(name)
        if not versions:
            have = ", ".join(sorted(self.loaded)) or "none"
            raise NotAvailable(f"servable is not available: servable {name!r} is not loaded (loaded: {have})")
        if version == 0:
            version = self._drawn(name, versions, client)
        elif version not in versions:
            raise NotAvailable(f"servable is not available: servable {name} version {version} is not loaded "
                               f"(loaded: {', '.join(map(str, sorted(versions)))})")
        self.routed(name, version)
        return versions[version]

    def _drawn(self, name: str, versions: Dict[int, LoadedVersion], client: Optional[str]) -> int:
        """A version by the servable's weights (its loaded ones; none weighted: the newest). The versions take
        consecutive shares of [0, 1), newest first, and a client key maps to a fixed point of it, so raising a new
        version's weight only moves clients onto it, never back and forth."""
        weighted = [(v, w) for v, w in sorted(self.traffic.get(name, {}).items(), reverse=True)
                    if v in versions and w > 0]
        if not weighted:
            return max(versions)
        point = (_fraction(f"{name}\n{client}") if client else random.random()) * sum(w for _, w in weighted)
        for version, weight in weighted:
            if point < weight:
                return version
            point -= weight
        return weighted[-1][0]

    def set_traffic(self, name: str, weights: Dict[int, float]) -> None:
        """Split the default traffic of `name` between its loaded versions by weight (any non-negative numbers,
        one positive); empty: the newest takes it all again. Requests running keep their version."""
        versions = self.loaded.get(name)
        if not versions:
            raise NotAvailable(f"servable is not available: servable {name!r} is not loaded")
        for version, weight in weights.items():
            if version not in versions:
                raise NotAvailable(f"traffic: servable {name} version {version} is not loaded (loaded: "
                                   f"{', '.join(map(str, sorted(versions)))}); load it first")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                    or weight < 0:
                raise ValueError(f"traffic: version {version}'s weight must be a finite number >= 0, got {weight!r}")
        if weights and not any(weights.values()):
            raise ValueError("traffic: every weight is 0; give one version a positive weight, or none to send "
                             "everything to the newest")
        traffic = {key: value for key, value in self.traffic.items() if key != name}
        self.traffic = {**traffic, name: dict(weights)} if weights else traffic

    @contextlib.contextmanager
    def using(self, loaded: LoadedVersion) -> Iterator[LoadedVersion]:
        """Mark `loaded` in use while a request runs on it, so an unload waits for the request."""
        self.users[id(loaded)] = self.users.get(id(loaded), 0) + 1
        try:
            yield loaded
        finally:
            self.users[id(loaded)] -= 1

    # ---- changes --------------------------------------------------------------------------------------

    async def load(self, name: str, version: int) -> LoadedVersion:
        """Load version `version` (0: the newest on disk) in the background, then make it available."""
        loop = asyncio.get_running_loop()
        try:
            loaded = await loop.run_in_executor(self.loader, load_version, self.servable_dir, name, version,
                                                self.key, self.max_batch, self.generation)
        except (ServableError, ValueError, OSError, RuntimeError) as error:  # PackageError is a RuntimeError
            if version and self._on_disk(name, version):  # not a version asked for before it was deployed
                self.failed[(name, version)] = str(error)
            raise
        async with self.lock:
            self.failed.pop((name, loaded.version), None)
            self.unloaded.discard((name, loaded.version))
            previous = self.loaded.get(name, {}).get(loaded.version)
            self.loaded = {**self.loaded, name: {**self.loaded.get(name, {}), loaded.version: loaded}}
        if previous is not None:
            await self._close_when_idle(previous)
        LOG.info("loaded servable %s version %d (methods %s)", name, loaded.version, ", ".join(loaded.methods))
        return loaded

    def _on_disk(self, name: str, version: int) -> bool:
        try:
            return version in list_versions(self.servable_dir, name)
        except ServableError:
            return False

    async def unload(self, name: str, version: int) -> None:
        """Make version `version` unavailable, then close it once its requests have finished."""
        async with self.lock:
            loaded = self.get(name, version) if version else None
            if loaded is None:
                raise NotAvailable(f"unload: give the version to unload of servable {name}")
            remaining = {n: dict(v) for n, v in self.loaded.items()}  # a new mapping: readers keep the old one
            del remaining[name][version]
            self.loaded = {n: v for n, v in remaining.items() if v}
            self.unloaded.add((name, version))
        await self._close_when_idle(loaded)
        LOG.info("unloaded servable %s version %d", name, version)

    async def _close_when_idle(self, loaded: LoadedVersion) -> None:
        while self.users.get(id(loaded), 0) > 0:
            await asyncio.sleep(0.01)
        self.users.pop(id(loaded), None)
        await loaded.close_batchers()
        await asyncio.get_running_loop().run_in_executor(None, loaded.close)

    async def refresh(self) -> List[Tuple[str, int]]:
        """Load each servable's newest version on disk unless it is loaded, failed or was unloaded on
        request; -> what was loaded. Failures are logged and kept in `failed`, never raised; what a refresh finds
        wrong on disk (a refused symlink, a missing folder) is logged when it appears, not at every poll."""
        found: Set[str] = set()
        try:
            names = list_servables(self.servable_dir)
        except ServableError as error:
            names = []
            found.add(str(error))
        done = []
        for name in names:
            try:
                versions = list_versions(self.servable_dir, name)
            except ServableError as error:
                found.add(str(error))
                continue
            if not versions:
                continue
            newest = versions[-1]
            key = (name, newest)
            if newest in self.loaded.get(name, {}) or key in self.unloaded:
                continue
            if key not in self.failed:
                try:
                    await self.load(name, newest)
                    done.append(key)
                    continue
                except (ServableError, ValueError, OSError, RuntimeError) as error:
                    LOG.error("servable %s version %d not loaded: %s", name, newest, error)
            if not self.loaded.get(name):
                done.extend(await self._fall_back(name, versions[:-1], newest))
        for warning in sorted(found - self.warnings):
            LOG.warning("%s", warning)
        self.warnings = found
        return done

    async def _fall_back(self, name: str, older: List[int], newest: int) -> List[Tuple[str, int]]:
        """Nothing of `name` is served and its newest version did not load: load the newest older version that
        does (each tried once: a failure is kept in `failed`), and say which; -> what was loaded."""
        for version in reversed(older):
            if (name, version) in self.failed or (name, version) in self.unloaded:
                continue
            try:
                await self.load(name, version)
            except (ServableError, ValueError, OSError, RuntimeError) as error:
                LOG.error("servable %s version %d not loaded either: %s", name, version, error)
                continue
            LOG.warning("servable %s: serving version %d, the newest that loads (version %d did not: %s)", name,
                        version, newest, self.failed.get((name, newest), "see above"))
            return [(name, version)]
        return []

    def state(self) -> dict:
        """Every servable on disk or loaded: its default version and each version's status."""
        on_disk = {}
        try:
            names = list_servables(self.servable_dir)
        except ServableError:
            names = []
        for name in names:  # one unreadable servable (a symlink pointing outside) hides only itself
            try:
                on_disk[name] = list_versions(self.servable_dir, name)
            except ServableError:
                continue
        names = sorted(set(on_disk) | set(self.loaded))
        report = {}
        for name in names:
            loaded = self.loaded.get(name, {})
            versions = {}
            for version in sorted(set(on_disk.get(name, [])) | set(loaded)):
                if version in loaded:
                    entry = {"status": "loaded", "methods": sorted(loaded[version].methods)}
                elif (name, version) in self.failed:
                    entry = {"status": "failed", "error": self.failed[(name, version)]}
                elif (name, version) in self.unloaded:
                    entry = {"status": "unloaded"}
                else:
                    entry = {"status": "available"}
                versions[str(version)] = entry
            report[name] = {"default_version": max(loaded) if loaded else None, "versions": versions}
            if self.traffic.get(name):  # a gray release's split, while one is set
                report[name]["traffic"] = {str(v): w for v, w in self.traffic[name].items()}
        return report

    async def close(self) -> None:
        async with self.lock:
            everything = [lv for versions in self.loaded.values() for lv in versions.values()]
            self.loaded = {}
        for loaded in everything:
            await self._close_when_idle(loaded)
        self.loader.shutdown(wait=False)
