"""AES-GCM keys for encrypted MindIR graphs, read from a file or an environment variable.

Never from the command line: arguments end up in shell history and in `ps` output. A key is 16, 24 or
32 bytes (AES-128/192/256): hex text in a file or the variable, or the raw bytes in a file.
"""
import os
from pathlib import Path
from typing import Optional

from mindvl.export.errors import PackageError

KEY_SIZES = (16, 24, 32)


def _parse(data: bytes, where: str, raw_allowed: bool) -> bytes:
    """Hex text first (a 32-byte file of hex digits is a 16-byte key written as hex), then raw bytes."""
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError is a ValueError too
        key = b""
    if len(key) in KEY_SIZES:
        return key
    if raw_allowed and len(data) in KEY_SIZES:
        return data
    raise PackageError(f"{where}: expected an AES key of 16, 24 or 32 bytes as hex text (32, 48 or 64 hex digits)"
                       f"{' or raw bytes' if raw_allowed else ''}, got {len(data)} bytes; make one with "
                       f"`python -c \"import os; print(os.urandom(32).hex())\" > key.hex`")


def read_key(key_file: Optional[str] = None, key_env: Optional[str] = None) -> Optional[bytes]:
    """The key from `key_file` or from the environment variable named `key_env`; None when neither is given."""
    if key_file and key_env:
        raise PackageError("give the key either as a file (--key-file) or as an environment variable (--key-env), "
                        "not both")
    if key_file:
        path = Path(key_file)
        if not path.is_file():
            raise PackageError(f"key file {path}: no such file")
        return _parse(path.read_bytes(), f"key file {path}", raw_allowed=True)
    if key_env:
        value = os.environ.get(key_env)
        if not value:
            raise PackageError(f"environment variable {key_env}: not set or empty; export it with the key's hex text")
        return _parse(value.encode(), f"environment variable {key_env}", raw_allowed=False)
    return None
