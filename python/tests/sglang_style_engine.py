"""The call sequence of sglang's Mooncake wrapper (python/sglang/srt/disaggregation/mooncake/
transfer_engine.py): initialize with a P2P handshake and protocol "rdma", session id
"host:get_rpc_port()", batch_register_memory, batch_transfer_sync_write to a session id.

Only the import differs from a Mooncake user's code.
"""

import logging

from kvferry.engine import TransferEngine  # was: from mooncake.engine import TransferEngine

logger = logging.getLogger(__name__)


class SglangStyleTransferEngine:
    def __init__(self, hostname, gpu_id, ib_device=None):
        self.engine = TransferEngine()
        self.hostname = hostname
        self.gpu_id = gpu_id
        self.ib_device = ib_device
        ret = self.engine.initialize(hostname, "P2PHANDSHAKE", "rdma",
                                     ib_device if ib_device is not None else "")
        if ret != 0:
            raise RuntimeError("transfer engine initialization failed")
        self.session_id = f"{self.hostname}:{self.engine.get_rpc_port()}"

    def batch_register(self, ptrs, lengths):
        try:
            ret = self.engine.batch_register_memory(ptrs, lengths)
        except Exception:
            ret = -1
        if ret != 0:
            logger.debug("batch registration failed")
        return ret

    def batch_deregister(self, ptrs):
        try:
            ret = self.engine.batch_unregister_memory(ptrs)
        except Exception:
            ret = -1
        return ret

    def transfer_sync(self, session_id, buffer, peer_buffer_address, length):
        try:
            ret = self.engine.transfer_sync_write(session_id, buffer, peer_buffer_address, length)
        except Exception:
            ret = -1
        return ret

    def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths):
        try:
            ret = self.engine.batch_transfer_sync_write(session_id, buffers,
                                                        peer_buffer_addresses, lengths)
        except Exception:
            ret = -1
        return ret

    def get_session_id(self):
        return self.session_id
