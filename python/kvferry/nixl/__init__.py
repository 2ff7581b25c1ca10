"""kvferry.nixl: NIXL's Python API (``nixl._api``, ``nixl._bindings``) on kvferry's engine.

vLLM's NixlConnector imports ``from nixl._api import nixl_agent, nixl_agent_config`` and
``from nixl._bindings import nixlXferTelemetry``. This package has that layout, so either

* put :func:`shim_path` on ``PYTHONPATH`` (a three-file ``nixl`` package that re-exports this
  one): ``PYTHONPATH=$(python3 -m kvferry.nixl --shim-path) vllm serve ...``; or
* call :func:`install_as_nixl` before vLLM imports nixl (e.g. from a sitecustomize).

docs/VLLM.md says what is exercised and what is not.
"""

import os
import sys

from . import _api, _bindings, _utils, logging
from ._api import (DEFAULT_COMM_PORT, nixl_agent, nixl_agent_config, nixl_backend_handle,
                   nixl_prepped_dlist_handle, nixl_thread_sync_t, nixl_xfer_handle)
from ._bindings import nixlXferTelemetry

__all__ = ["DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config", "nixl_backend_handle",
           "nixl_prepped_dlist_handle", "nixl_thread_sync_t", "nixl_xfer_handle",
           "nixlXferTelemetry", "install_as_nixl", "shim_path"]


def shim_path():
    """The directory holding the ``nixl`` shim package (put it on sys.path / PYTHONPATH)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")


def install_as_nixl():
    """Makes ``import nixl`` and its modules (``_api``, ``_bindings``, ``_utils``,
    ``logging``) resolve to this package in this process. Refuses (RuntimeError) when a
    different ``nixl`` is already imported."""
    current = sys.modules.get("nixl")
    if current is not None and getattr(current, "__kvferry__", False) is False \
            and current is not sys.modules[__name__]:
        raise RuntimeError(f"a different nixl is already imported: {current!r}")
    sys.modules["nixl"] = sys.modules[__name__]
    sys.modules["nixl._api"] = _api
    sys.modules["nixl._bindings"] = _bindings
    sys.modules["nixl._utils"] = _utils
    sys.modules["nixl.logging"] = logging


__kvferry__ = True
