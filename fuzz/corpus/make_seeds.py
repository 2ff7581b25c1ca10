#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus: a few valid inputs per target, in the layouts of
src/transport/tcp/tcp_wire.h, src/metadata/segment_descriptor.cc and
include/kvferry/pd/control_message.h. The outputs are checked in; rerun after a format
change: python3 fuzz/corpus/make_seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    mode = "w" if isinstance(data, str) else "wb"
    with open(os.path.join(HERE, target, name), mode) as f:
        f.write(data)


# tcp_wire: magic "KVFD", version 2, type, request_id, addr, length, deadline_ns, status, 0
def tcp(frame_type, request_id=0, addr=0, length=0, deadline_ns=0, status=0):
    return struct.pack("<IHHQQQqII", 0x4446564B, 2, frame_type, request_id, addr, length,
                       deadline_ns, status, 0)


# A vector frame (8 WriteV, 9 ReadV): header with addr = entry count, then the table.
def tcp_vector(frame_type, entries, request_id=0, deadline_ns=0):
    total = sum(length for _, length in entries)
    table = b"".join(struct.pack("<QQ", addr, length) for addr, length in entries)
    return tcp(frame_type, request_id, len(entries), total, deadline_ns) + table


write("tcp_wire", "hello", tcp(1, deadline_ns=123456789))
write("tcp_wire", "hello_ack_nonce", tcp(2, request_id=77, length=32, deadline_ns=5))
write("tcp_wire", "auth", tcp(3, length=32))
write("tcp_wire", "write_4k", tcp(4, request_id=9, addr=0x7F0000001000, length=4096,
                                  deadline_ns=10**12))
write("tcp_wire", "read_64m", tcp(5, request_id=10, addr=0x7F0000000000, length=64 << 20))
write("tcp_wire", "ack_not_registered", tcp(6, request_id=9, status=2))
write("tcp_wire", "read_data_error", tcp(7, request_id=10, status=12))
write("tcp_wire", "write_v_3", tcp_vector(8, [(0x7F0000001000, 4096), (0x7F0000010000, 1),
                                              (0x7F0000020000, 65536)], request_id=11,
                                          deadline_ns=10**12))
write("tcp_wire", "read_v_2", tcp_vector(9, [(0x7F0000000000, 4096), (0x7F0000003000, 512)],
                                         request_id=12))

# segment_descriptor: what an engine publishes (serialize_segment_descriptor)
base = {"format": 3, "name": "prefill-0", "endpoint": "10.0.0.1:41000", "incarnation": 99,
        "host_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427/4026531836", "pid": 4242,
        "transports": ["shm", "tcp"], "version": 3, "regions": []}
write("segment_descriptor", "no_regions", json.dumps(base))
with_regions = dict(base, tcp_endpoint="10.0.0.1:41001", shm_socket="kvferry-shm/4242/63",
                    cma_socket="kvferry-cma/4242/63", regions=[
    {"addr": 140000000000, "length": 1 << 20, "device": -1,
     "shm": {"fd": 17, "offset": 0, "file_bytes": 1 << 21, "inode": 991,
             "guard_offset": 1 << 20, "guard_slot": 0, "generation": 1}},
    {"addr": 140000000000 + (2 << 20), "length": 4096, "device": 0}])
write("segment_descriptor", "two_regions", json.dumps(with_regions))
with_ucx = dict(base, transports=["tcp", "ucx"], tcp_endpoint="10.0.0.1:41001",
                ucx={"worker_address": "0a1b2c3d4e5f", "hardware_rma": True},
                regions=[{"addr": 140000000000, "length": 1 << 20, "device": -1,
                          "ucx_rkey": "00ff10203040"}])
write("segment_descriptor", "ucx_worker_and_rkey", json.dumps(with_ucx))
write("segment_descriptor", "unknown_transport",
      json.dumps(dict(base, transports=["rdma-v9", "tcp"])))


# control_message: magic "KVFP", version 1, type u16, payload length u32, then the payload
def control(message_type, payload):
    return struct.pack("<IHHI", 0x5046564B, 1, message_type, len(payload)) + payload


def string(s):
    return struct.pack("<I", len(s)) + s.encode()


layout = (struct.pack("<III", 0, 2, 8) + string("10.0.0.2:42000") + struct.pack("<Q", 5) +
          struct.pack("<IIIIB", 16, 4, 128, 2, 0) +
          struct.pack("<I", 2) +
          struct.pack("<QQQQIBB", 0x10000, 1 << 20, 16384, 16384, 0, 0, 0) +
          struct.pack("<QQQQIBB", 0x200000, 1 << 20, 16384, 16384, 0, 1, 0) +
          struct.pack("<I", 1) + struct.pack("<QQQ", 0x400000, 4096, 64) +
          struct.pack("<I", 1) + struct.pack("<QQQQ", 0x500000, 8192, 128, 1))
write("control_message", "register_layout", control(1, layout))
write("control_message", "register_reply",
      control(2, struct.pack("<IQB", 1, 6, 0) + string("")))
write("control_message", "transfer_request",
      control(3, struct.pack("<QIBQQ", 1234, 1, 0, 7, 2**64 - 1) + struct.pack("<I3I", 3, 4, 5, 9)))
write("control_message", "request_status",
      control(4, struct.pack("<QBB", 1234, 0, 9) + string("peer timed out")))
# Success with the optional page-integrity field: footprint ranges (entry, offset, bytes),
# then digests (page, xxh3).
write("control_message", "request_status_integrity",
      control(4, struct.pack("<QBB", 1234, 4, 0) + string("") +
              struct.pack("<I", 2) + struct.pack("<IQQ", 0, 0, 64) + struct.pack("<IQQ", 1, 32, 32) +
              struct.pack("<I", 2) + struct.pack("<IQ", 20, 0x1234) + struct.pack("<IQ", 22, 7)))
write("control_message", "abort", control(5, struct.pack("<Q", 1234) + string("cancelled")))
write("control_message", "abort_ack", control(6, struct.pack("<Q", 1234)))
write("control_message", "heartbeat", control(7, struct.pack("<QQ", 8, 6)))
write("control_message", "auth_challenge",
      control(8, string("\x11" * 32) + struct.pack("<Q", 0x0123456789ABCDEF)))
write("control_message", "auth_challenge_open", control(8, string("") + struct.pack("<Q", 7)))
