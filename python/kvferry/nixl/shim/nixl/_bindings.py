"""``nixl._bindings`` as kvferry.nixl._bindings."""
from kvferry.nixl._bindings import *  # noqa: F401,F403
