"""Put first on PYTHONPATH by `fastfeed profile`: installs the profiler's hooks in every Python process of the profiled
command (fastfeed/profile/probe.py, hooks.py), then runs the sitecustomize this one shadows, if there is one."""
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

try:
    from fastfeed.profile.probe import install

    install()
except Exception as e:  # noqa: BLE001 - a profiler that cannot hook in must not stop the user's script
    print(f"fastfeed profile: hooks not installed in {sys.argv[:1]} ({type(e).__name__}: {e})", file=sys.stderr)

# The sitecustomize this one shadows (a site's own, or a virtualenv's), run under another module name.
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.origin:
    _spec = importlib.util.spec_from_file_location("_fastfeed_shadowed_sitecustomize", _spec.origin)
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _mod
    _spec.loader.exec_module(_mod)
