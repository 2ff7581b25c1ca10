"""``nixl._api`` as kvferry.nixl._api."""
from kvferry.nixl._api import *  # noqa: F401,F403
from kvferry.nixl._api import nixl_agent, nixl_agent_config, nixl_xfer_handle  # noqa: F401
