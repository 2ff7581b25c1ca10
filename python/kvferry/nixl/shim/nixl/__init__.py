"""A ``nixl`` package that is kvferry.nixl (see kvferry/nixl/__init__.py, docs/VLLM.md).

Importing it makes ``nixl`` and its modules (``_api``, ``_bindings``, ``_utils``,
``logging``) the very module objects of kvferry.nixl, so that what patches one (a test's
monkeypatch, say) patches the other.
"""
__kvferry__ = True

import kvferry.nixl  # noqa: E402

kvferry.nixl.install_as_nixl()
