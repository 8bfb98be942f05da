"""`ServeConfig`: the settings of `mindvl serve`, one flag each (mindvl/cli/serving.py makes the flags from its
fields; a YAML file may hold them under the same keys), checked before anything listens so that a bad value is
one line naming the fix, never a server that serves nothing."""
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict

from mindvl.config import build_dataclass
from mindvl.errors import ConfigError
from mindvl.package_reader import MANIFEST
from mindvl.serving.runtime import MAX_GRAPH_BATCH
from mindvl.serving.servable import CONFIG_FILE

MB = 2 ** 20


@dataclass
class ServeConfig:
    """Settings of `mindvl serve` (each a command-line flag; a YAML file may hold them under these keys)."""

    servable_dir: str = ""
    host: str = "127.0.0.1"  # loopback only unless told otherwise
    port: int = 1500  # REST; 0: any free port (MindSpore Serving's examples use 1500 for REST)
    grpc_port: int = 5500  # 0: any free port, -1: no gRPC server
    batching: bool = True
    max_batch_size: int = 16  # instances run together on a model graph (from concurrent requests)
    max_wait_ms: float = 2.0  # how long a batch waits for more requests once it could run
    workers: int = 4  # threads for the Python stages (decode, resize, tokenise, log-mel)
    max_request_mb: float = 32.0
    max_instances: int = 64  # per request
    timeout_s: float = 60.0  # per request, queueing included; and for a REST body to arrive
    header_timeout_s: float = 10.0  # a REST request head must arrive within this (from the connection's start or
    # from the first byte of a later request on it)
    keepalive_s: float = 15.0  # an idle kept-alive REST connection is closed after this
    max_connections: int = 256  # REST connections open at once (more are answered 503 and closed)
    max_inflight_mb: float = 512.0  # request bodies held at once: REST bodies wait for room (from before they are
    # read until answered); gRPC calls in progress are limited to max_inflight_mb / max_request_mb
    decode_slots: int = 2  # pixels decoding at once: this many 4096x4096 images (128 MB each), or more smaller ones
    strict_http: bool = False  # 4xx/5xx for the predict protocol's errors too, instead of MindSpore Serving's HTTP 200
    poll_s: float = 2.0  # how often the servable directory is checked for new versions; 0: never
    key_file: str = ""  # AES-GCM key of encrypted packages, from a file ...
    key_env: str = ""  # ... or from this environment variable
    admin_token_file: str = ""  # the admin endpoints' bearer token, from a file ...
    admin_token_env: str = ""  # ... or from this environment variable; neither: the admin endpoints are off
    demo: bool = True  # the demo page at GET / (a client of the same endpoints; mindvl serve --no-demo: off)
    prefix_cache_mb: float = 0.0  # generative versions keep earlier prompts' cache rows (up to this much each) for
    # prompts that start the same way (a system prompt, an earlier turn, an image); 0: off
    speculative_tokens: int = 0  # generative versions verify this many prompt-lookup draft tokens a step; 0: off

    def validate(self) -> "ServeConfig":
        if not self.servable_dir:
            raise ConfigError("servable_dir: required; pass --servable-dir DIR (fill it with `mindvl deploy`)")
        folder = Path(self.servable_dir)
        if not folder.is_dir():
            raise ConfigError(f"servable_dir: {folder} is not a folder; create it with "
                              f"`mindvl deploy PKG --servable-dir {folder} --name NAME`")
        if (folder / CONFIG_FILE).is_file():
            raise ConfigError(f"servable_dir: {folder} is one servable's folder (it holds {CONFIG_FILE}); serve the "
                              f"directory of servables above it: --servable-dir {folder.resolve().parent}")
        if (folder / MANIFEST).is_file():
            raise ConfigError(f"servable_dir: {folder} is a model package; deploy it into a servable directory "
                              f"(`mindvl deploy {folder} --servable-dir DIR --name NAME`) and serve DIR")
        for name in ("max_batch_size", "workers", "max_instances", "max_connections", "decode_slots"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, got {getattr(self, name)}")
        for name in ("max_request_mb", "timeout_s", "header_timeout_s", "keepalive_s", "max_inflight_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: expected a number > 0, got {getattr(self, name)}")
        if self.max_inflight_mb < self.max_request_mb:
            raise ConfigError(f"max_inflight_mb: {self.max_inflight_mb:g} is less than max_request_mb "
                              f"{self.max_request_mb:g}, so a body of the largest size could never be served; "
                              f"raise --max-inflight-mb or lower --max-request-mb")
        for name in ("max_wait_ms", "poll_s", "prefix_cache_mb", "speculative_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: expected a number >= 0, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535 or not -1 <= self.grpc_port <= 65535:
            raise ConfigError(f"port {self.port} / grpc_port {self.grpc_port}: expected 0..65535 (grpc_port -1: off)")
        if self.max_batch_size > MAX_GRAPH_BATCH:
            raise ConfigError(f"max_batch_size: at most {MAX_GRAPH_BATCH}, got {self.max_batch_size}")
        return self

    @property
    def max_request_bytes(self) -> int:
        """The largest request body (REST, as it arrives and decoded) and gRPC message, in bytes."""
        return int(self.max_request_mb * MB)

    @classmethod
    def from_mapping(cls, values: Dict[str, Any]) -> "ServeConfig":
        return build_dataclass(cls, values)
