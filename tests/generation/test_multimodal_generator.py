"""A trained generative run opened in Python generates without MindSpore's C++ warnings on the terminal."""
import os
import subprocess
import sys

SCRIPT = """
import numpy as np
import mindvl
from mindvl.generation import MultimodalPrompt

generator = mindvl.from_pretrained({run!r}, cache_len=64)
image = np.zeros((3, generator.pre.image_size, generator.pre.image_size), np.float32)
print(type(generator).__name__, repr(generator.generate(MultimodalPrompt("what color is the shape?", image),
                                                        max_new_tokens=3).text))
"""


def test_generating_in_python_prints_no_analyzer_warnings(generative_run):
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}  # as a user's shell has it
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(run=str(generative_run[1].output_dir))],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("MultimodalGenerator ")
    assert "[WARNING]" not in done.stderr, done.stderr[-3000:]
