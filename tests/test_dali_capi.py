"""DaliDecoder's pipelines run through libdali's C API (fastfeed/decode/dali_capi.py, ctypes), on DALI's CPU backend:
the same pixels as DALI's Python binding gives for the same serialized graph, DALI's own error messages, and handles
that cannot be used after close."""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")
torch = pytest.importorskip("torch")

from fastfeed.decode.crop import crop_windows  # noqa: E402
from fastfeed.decode.dali import DaliDecoder  # noqa: E402
from fastfeed.decode.dali_capi import CPipeline, DaliCError  # noqa: E402


@pytest.fixture(scope="module")
def photos():
    from fastfeed import demo_data as dd

    dd._init_worker()
    out, sizes = [], []
    for i in range(12):
        data, size, _ = dd._render(3, i, progressive=i % 4 == 0)
        out.append(np.frombuffer(data, dtype=np.uint8))
        sizes.append(size)
    # one buffer with views, as the ring hands a batch over
    buf = np.concatenate(out)
    ends = np.cumsum([len(x) for x in out])
    views = [buf[e - len(x):e] for e, x in zip(ends, out)]
    windows = crop_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(12), seed=1, epoch=0, train=True,
                           image_size=64)
    return views, windows


def _broken(jpeg: np.ndarray) -> np.ndarray:
    """A JPEG's signature and first segments, then garbage: DALI fails the batch holding it."""
    return np.concatenate([jpeg[:200], np.full(3000, 7, np.uint8)])


def _binding_run(dec, samples, windows):
    """The decoder's graph built, fed and run by DALI's Python binding: benchmarks/dali_binding.py, the baseline the
    H200 benchmarks compare the C API against (so this also checks that baseline decodes what the decoder does)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from dali_binding import BindingPipeline

    pipe = BindingPipeline(dec._serialized, batch_size=dec.batch_size, num_threads=2, device_id=None)
    dec._feed(pipe, samples, windows)
    with pipe.run() as out:
        return np.array(out.host_view())


@pytest.mark.parametrize("channels_last", [False, True])
def test_same_pixels_as_the_python_binding(photos, channels_last):
    # uint8: everything the batch goes through is DALI's (other dtypes are normalised afterwards by the lookup-table
    # kernel on the CPU backend: decode/dali.py).
    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, channels_last=channels_last, batch_size=16)
    try:
        ours = dec(samples, windows).images
        raw = _binding_run(dec, samples, windows)
    finally:
        dec.close()
    expect = torch.from_numpy(raw)
    if channels_last:
        expect = expect.permute(0, 3, 1, 2)
    assert ours.shape == expect.shape == (12, 3, 64, 64)
    assert raw.std() > 10
    assert torch.equal(ours, expect)


def test_operator_error_is_dalis_message_and_the_decoder_goes_on(photos):
    samples, windows = photos
    broken = _broken(samples[0])
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    try:
        with pytest.raises(DaliCError, match="encountered"):
            dec._run([broken] + samples[1:], windows)
        res = dec([broken] + samples[1:], windows)
        assert [r[0] for r in res.replaced] == [0] and "DALI:" in res.replaced[0][2]
        again = dec(samples, windows).images
        assert again.shape == (12, 3, 64, 64) and again.float().std() > 10
    finally:
        dec.close()


def test_a_replacement_that_cannot_be_built_closes_the_decoder(photos, monkeypatch):
    """The build of the fresh pipeline fails (the device out of memory, say): the failed pipeline is closed all the
    same, the decoder refuses further work, and the build's error is what the caller sees."""
    samples, windows = photos
    broken = _broken(samples[0])
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    failed = dec._pipe

    def no_build():
        raise MemoryError("no room for a pipeline")
    monkeypatch.setattr(dec, "_build", no_build)
    with pytest.raises(MemoryError, match="no room"):
        dec._run([broken] + samples[1:], windows)
    assert dec._pipe is None and failed._h is None
    with pytest.raises(RuntimeError, match="closed"):
        dec(samples, windows)


def test_a_decoder_closed_while_its_pipeline_is_rebuilt_stays_closed(photos, monkeypatch):
    """close() from another thread lands while a failed run rebuilds the pipeline (the build runs without the
    decoder's lock, as a GPU build takes 1.7 s): the fresh pipeline is closed too, not left on the closed decoder."""
    samples, windows = photos
    broken = _broken(samples[0])
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    build, built = dec._build, []

    def build_while_closed():
        dec.close()  # what the other thread does meanwhile
        built.append(build())
        return built[-1]
    monkeypatch.setattr(dec, "_build", build_while_closed)
    with pytest.raises(DaliCError):
        dec._run([broken] + samples[1:], windows)
    assert dec._pipe is None and built and built[0]._h is None
    with pytest.raises(RuntimeError, match="closed"):
        dec(samples, windows)


def test_a_close_that_lands_inside_a_call_is_not_blamed_on_the_records(photos, monkeypatch):
    """close() from another thread lands after a call checked the decoder and before its run: the call ends with the
    decoder's closed error, not with every record of the batch reported as undecodable (seen in the full suite, where
    test_closing_while_another_thread_decodes_ends_it_with_an_error then died with CorruptSampleError)."""
    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    run = dec._run

    def closed_first(*a, **k):
        dec.close()  # what the other thread does meanwhile
        return run(*a, **k)
    monkeypatch.setattr(dec, "_run", closed_first)
    with pytest.raises(RuntimeError, match="decoder is closed"):
        dec(samples, windows)


def test_closed_handles_refuse_work(photos):
    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    pipe = CPipeline(dec._serialized, batch_size=16, num_threads=2, device_id=None)
    dec.close()
    pipe.close()
    pipe.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        pipe.run()
    with pytest.raises(RuntimeError, match="closed"):
        dec(samples, windows)


def test_outputs_view_and_copy_agree(photos):
    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, channels_last=True, batch_size=16)
    try:
        with dec._run(samples, windows) as out:
            assert out.shape == (12, 64, 64, 3) and out.dtype == np.uint8
            copy = np.empty(out.shape, out.dtype)
            out.copy_to(copy.ctypes.data, gpu=False)
            view = out.host_view()
            assert view is None or np.array_equal(view, copy)
            assert copy.std() > 10
    finally:
        dec.close()


def test_closing_while_another_thread_decodes_ends_it_with_an_error(photos):
    """A Loader closes its decoders after joining its workers with a timeout: a worker that did not stop may still be
    inside a pipeline call. close() waits for that call instead of destroying the pipeline under it; the worker's
    next call raises instead of touching a destroyed pipeline."""
    import threading
    import time

    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    done, errors = [], []

    def work():
        try:
            while True:
                dec(samples, windows)
                done.append(1)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=work)
    t.start()
    while len(done) < 2 and t.is_alive():
        time.sleep(0.002)
    dec.close()
    t.join(timeout=30)
    assert not t.is_alive() and len(done) >= 2
    assert errors and "closed" in errors[0], errors


def test_outputs_outlive_their_closed_pipeline(photos):
    """Outputs kept past close() stay readable, and the pipeline is destroyed when the last of them is closed
    (DALI 2.4 crashed destroying outputs after their pipeline)."""
    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, batch_size=16)
    pipe = dec._pipe
    out = dec._run(samples, windows)
    dec.close()
    assert pipe._closing is not None  # waiting for its outputs
    copy = np.empty(out.shape, out.dtype)
    out.copy_to(copy.ctypes.data, gpu=False)
    assert copy.std() > 10
    out.close()
    assert pipe._closing is None and pipe._dependents == 0


def test_a_zero_copy_view_keeps_its_pipeline(photos):
    """zero_copy's view (what torch.as_tensor keeps on a GPU) is a dependent too: its data stays readable after the
    outputs and the decoder are closed, and the pipeline goes when the view does. On the CPU backend the view points
    at host memory, so the lifetime can be checked here; tests/test_gpu.py checks it through torch."""
    import ctypes
    import gc

    samples, windows = photos
    dec = DaliDecoder(device_id=None, image_size=64, dtype=torch.uint8, channels_last=True, batch_size=16)
    pipe = dec._pipe
    with dec._run(samples, windows) as out:
        view, shape = out.as_cuda_array(), out.shape
        expect = np.empty(shape, np.uint8)
        out.copy_to(expect.ctypes.data, gpu=False)
    dec.close()
    assert pipe._closing is not None and pipe._dependents == 1
    ptr = view.__cuda_array_interface__["data"][0]
    data = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), shape)
    assert np.array_equal(data, expect) and expect.std() > 10
    del view, data
    gc.collect()
    assert pipe._closing is None and pipe._dependents == 0
