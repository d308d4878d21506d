"""Loaded by every Python process of a real SGLang unit (its PYTHONPATH names this directory).

SGLang 0.5.23's mooncake KV sender declares `supports_host_tensor_indices = True`, which sends
the first real PD transfer down a pinned-memory path that records a `torch.cuda.Event`; on a
machine without a GPU the prefill then fails the transfer ("Found no NVIDIA driver"). Setting
the class attribute to False once `sglang.srt.disaggregation.mooncake.conn` is imported makes
the sender take its plain path. Nothing in the installed package is modified.
"""

import importlib.abc
import importlib.util
import sys

_TARGET = "sglang.srt.disaggregation.mooncake.conn"


def _patch(module):
    sender = getattr(module, "MooncakeKVSender", None)
    if sender is not None:
        sender.supports_host_tensor_indices = False


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = patched
        return spec


if _TARGET in sys.modules:
    _patch(sys.modules[_TARGET])
else:
    sys.meta_path.insert(0, _Finder())
