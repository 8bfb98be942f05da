"""mindvl.files: the sha256 and the write-then-rename helpers every durable writer uses."""
import hashlib
import os
import subprocess
import sys

import pytest

from mindvl.files import atomic_write, pid_alive, sha256_file, swap_folder, work_folder


def test_file_sha256_reads_in_blocks_and_matches_hashlib(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 5000)
    assert sha256_file(path, block=1000) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "state.json"
    atomic_write(target, lambda tmp: tmp.write_text("old"))

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary left


def test_swap_folder_replaces_a_folder_whole_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "package"
    for content in ("first", "second"):
        work = work_folder(target)
        assert work.parent == tmp_path and work.name.startswith(".tmp_package_")
        (work / "file.txt").write_text(content)
        swap_folder(work, target)
    assert (target / "file.txt").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package"]


def test_an_exclusive_swap_never_replaces_a_folder_another_writer_filled(tmp_path):
    target = tmp_path / "1"
    target.mkdir()
    (target / "theirs").write_text("x")
    work = work_folder(target)
    (work / "ours").write_text("y")
    with pytest.raises(OSError):
        swap_folder(work, target, exclusive=True)
    assert sorted(p.name for p in target.iterdir()) == ["theirs"]


def test_pid_alive_tells_a_running_process_from_a_finished_one():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert pid_alive(os.getpid())
    assert not pid_alive(int(done.stdout))
