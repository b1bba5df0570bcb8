"""A DALI pipeline on the CPU backend is built with nvImageCodec's CPU extensions only (fastfeed/decode/codecs.py; on
a GPU host the GPU ones cost ~1 s per build): which extensions a build loads, that it decodes the same pixels as with
every extension (after the build's folder of links is gone), that the variable is the user's again after the build,
and that a child forked during a build can build."""
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")
pytest.importorskip("torch")

from fastfeed.decode import codecs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Runs in a fresh process, so that no pipeline of another test has loaded extensions: builds a CPU DaliDecoder, lists
# the extension modules mapped while it is alive, decodes JPEGs and PNGs, and says what the C environment holds after.
CHILD = r"""
import ctypes, io, json, sys
from pathlib import Path
import numpy as np
from PIL import Image
from fastfeed import demo_data as dd
from fastfeed.decode.crop import crop_windows
from fastfeed.decode.dali import DaliDecoder

dd._init_worker()
samples, sizes = [], []
for i in range(8):
    data, size, _ = dd._render(3, i, progressive=False)
    if i % 2:  # every other one as a PNG
        buf = io.BytesIO()
        Image.open(io.BytesIO(data)).save(buf, "PNG")
        data = buf.getvalue()
    samples.append(np.frombuffer(data, dtype=np.uint8))
    sizes.append(size)
windows = crop_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(8), seed=1, epoch=0, train=True,
                       image_size=64)
dec = DaliDecoder(device_id=None, image_size=64, batch_size=8, num_threads=2)
mapped = sorted({ln.split("/")[-1].split(".so")[0] for ln in Path("/proc/self/maps").read_text().splitlines()
                 if "_ext.so" in ln})
out = dec(samples, windows)
np.save(sys.argv[1], out.images.numpy())
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
var = getenv(b"NVIMGCODEC_EXTENSIONS_PATH")
print("RESULT " + json.dumps({"mapped": mapped, "replaced": len(out.replaced),
                              "variable_after": var.decode() if var else None}))
dec.close()
"""


def _child(tmp_path, name, variable=None):
    """The child's result and its pixels; `variable`: the user's NVIMGCODEC_EXTENSIONS_PATH (none by default)."""
    env = {k: v for k, v in os.environ.items() if k != codecs.VARIABLE}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if variable is not None:
        env[codecs.VARIABLE] = variable
    pixels = tmp_path / f"{name}.npy"
    run = subprocess.run([sys.executable, "-c", CHILD, str(pixels)], env=env, capture_output=True, text=True,
                         timeout=300)
    line = next((x[7:] for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, run.stderr[-2000:]
    return json.loads(line), np.load(pixels)


@pytest.mark.integration  # a fresh interpreter per decode
def test_a_cpu_pipeline_loads_only_the_cpu_extensions_and_decodes_the_same_pixels(tmp_path):
    installed = codecs.extensions_folder()
    assert installed is not None and any(f.name.startswith("libnvjpeg_ext") for f in installed.iterdir())
    ours, pixels = _child(tmp_path, "ours")
    assert "libjpeg_turbo_ext" in ours["mapped"] and "libopencv_ext" in ours["mapped"]
    assert not [m for m in ours["mapped"] if m.startswith(codecs.GPU_EXTENSIONS)], ours["mapped"]
    assert ours["replaced"] == 0 and ours["variable_after"] is None
    # A variable the user set is theirs: here every extension, which is what DALI loads by itself.
    theirs, every = _child(tmp_path, "every", str(installed))
    assert "libnvjpeg_ext" in theirs["mapped"] and theirs["variable_after"] == str(installed)
    assert theirs["replaced"] == 0
    assert pixels.shape == (8, 3, 64, 64) and (pixels == every).all()


def test_only_a_cpu_build_sees_the_folder_and_the_variable_goes_back():
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    if codecs.VARIABLE in os.environ:
        pytest.skip("the environment sets NVIMGCODEC_EXTENSIONS_PATH itself")
    with codecs.extensions_for(gpu=True):
        assert getenv(codecs.VARIABLE.encode()) is None
    with codecs.extensions_for(gpu=False):
        folder = Path(getenv(codecs.VARIABLE.encode()).decode())
        names = sorted(f.name for f in folder.iterdir())
    assert getenv(codecs.VARIABLE.encode()) is None and not folder.exists()  # made for the build, gone after it
    assert any(n.startswith("libjpeg_turbo_ext") for n in names)
    assert not [n for n in names if n.startswith(codecs.GPU_EXTENSIONS)]
    assert codecs.VARIABLE not in os.environ  # Python's copy of the environment was never touched
    # Set in the C environment only (by a library, say): the user's too, left as it is.
    os.putenv(codecs.VARIABLE, "/their/extensions")
    try:
        with codecs.extensions_for(gpu=False):
            assert getenv(codecs.VARIABLE.encode()) == b"/their/extensions"
        assert getenv(codecs.VARIABLE.encode()) == b"/their/extensions"
    finally:
        os.unsetenv(codecs.VARIABLE)


@pytest.mark.integration  # forks
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_build_can_build():
    """Another thread holds the build lock (a build in progress) when the process forks: the child, which no thread
    of the parent's follows into, must still be able to build its own pipelines."""
    import signal
    import threading

    inside, release = threading.Event(), threading.Event()

    def building():
        with codecs.extensions_for(gpu=True):
            inside.set()
            release.wait(30)
    t = threading.Thread(target=building)
    t.start()
    try:
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: a bounded try, then exit without running the parent's cleanup
            signal.alarm(10)
            try:
                with codecs.extensions_for(gpu=True):  # the lock alone (no folder for the child to leave behind)
                    pass
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x} (killed by the alarm: hung)"
