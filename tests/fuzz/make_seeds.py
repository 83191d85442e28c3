#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_tcp_frame, fuzz_shm_header and fuzz_checkpoint
(tests/fuzz/corpus/tcp_frame/, shm_header/, checkpoint/): valid records and the edge cases named
after them. Their input layouts are described at the top of fuzz_tcp_frame.cpp, fuzz_shm_header.cpp
and fuzz_checkpoint.cpp; the structs are those of src/transport/tcp/wire.hpp,
src/transport/shm/segment.hpp and src/libtorch/checkpoint_bytes.hpp on x86-64
(little-endian).
Run from anywhere: python3 tests/fuzz/make_seeds.py"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- TCP ----

FRAME_MAGIC = 0x46545554
DATA, ABORT, SIZE_ERROR, ACK, GOODBYE, LEAVE = 1, 2, 3, 4, 5, 6
COLLECTIVE, P2P = 0, 1
U8, F32 = 1, 8  # DataType indices
SUM = 0

POST_A, REDUCE, ON_P2P, POST_LATE, ANNOUNCE, POST_SEND, POST_B, BIG = 1, 2, 4, 8, 16, 32, 64, 128


def setup(flags=0, type_op=0, recv_bytes=0, send_bytes=0):
    return struct.pack("<BBHH", flags, type_op, recv_bytes, send_bytes)


def signature(seq=0, count=0, counts_hash=0, root=-1, kind=0xFF, algorithm=0xFF, type_=0, op=-1):
    return struct.pack("<QQQiBBBbQ", seq, count, counts_hash, root, kind, algorithm, type_, op, 0)


def mine(count, type_):
    """Rank 0's signature for collective #0 when Setup has ANNOUNCE: allreduce, ring, sum."""
    return signature(seq=0, count=count, kind=0, algorithm=1, type_=type_, op=SUM)


def frame(kind, payload=b"", comm=1, channel=COLLECTIVE, seq=0, index=0, code=0, length=None, sig=None,
          magic=FRAME_MAGIC, reserved=0):
    header = struct.pack("<IBBHIIQQQ", magic, kind, channel, reserved, index, code, comm, seq,
                         len(payload) if length is None else length)
    return header + (sig if sig is not None else signature()) + payload


def goodbye():
    return frame(GOODBYE)


def tcp_seeds():
    text = b"rank 1 failed: out of memory"
    return {
        "empty_stream": setup(),
        "goodbye_only": setup(POST_A, 0, 8) + goodbye(),
        "data_into_posted_receive": setup(POST_A | ANNOUNCE, 0, 16)
        + frame(DATA, bytes(range(16)), sig=mine(16, U8)) + goodbye(),
        "data_into_receive_and_reduce": setup(POST_A | REDUCE | ANNOUNCE, F32, 32)
        + frame(DATA, struct.pack("<8f", *range(8)), sig=mine(8, F32)) + goodbye(),
        "data_reduce_split_element": setup(POST_A | REDUCE, F32, 8) + frame(DATA, b"\x00\x00\x80\x3f\x00\x00", length=8),
        "data_two_receives": setup(POST_A | POST_B | ANNOUNCE, 0, 4)
        + frame(DATA, b"abcd", sig=mine(4, U8)) + frame(DATA, b"efgh", seq=1) + goodbye(),
        "data_p2p_acked": setup(POST_A | ON_P2P, 0, 10) + frame(DATA, b"0123456789", channel=P2P) + goodbye(),
        "data_unexpected_then_posted": setup(POST_A | ON_P2P | POST_LATE, 0, 10)
        + frame(DATA, b"0123456789", channel=P2P) + goodbye(),
        "data_big_receive_cut_short": setup(POST_A | BIG, 0, 0) + frame(DATA, b"\x42" * 3000, length=65536),
        "data_size_mismatch": setup(POST_A | ON_P2P, 0, 16) + frame(DATA, b"12345678", channel=P2P) + goodbye(),
        "data_signature_mismatch": setup(POST_A | ANNOUNCE, 0, 16)
        + frame(DATA, bytes(16), sig=signature(seq=0, count=99, kind=200, algorithm=77, type_=250, op=99)),
        "data_unknown_communicators": setup()
        + b"".join(frame(DATA, comm=1000 + i) for i in range(70)),
        "data_over_unexpected_cap": setup() + frame(DATA, b"z" * 100, length=2 << 20),
        "data_huge_length": setup(POST_A, 0, 8) + frame(DATA, length=1 << 62),
        "data_huge_length_unknown_comm": setup() + frame(DATA, comm=12345, length=1 << 62),
        "data_repeated_key": setup() + frame(DATA, b"aa", channel=P2P) + frame(DATA, b"bbbb", channel=P2P) + goodbye(),
        "ack_for_send": setup(POST_SEND, 0, 0, 8) + frame(ACK, channel=P2P) + goodbye(),
        "ack_unknown": setup() + frame(ACK, channel=P2P, seq=77, index=3) + goodbye(),
        "size_error_for_send": setup(POST_SEND, 0, 0, 8)
        + frame(SIZE_ERROR, b"message size mismatch: rank 1 expected 4", channel=P2P),
        "abort_with_text": setup(POST_A, 0, 8) + frame(ABORT, text, seq=5, code=3),
        "abort_without_text": setup(POST_A, 0, 8) + frame(ABORT, code=3),
        "abort_text_starting_with_nul": setup(POST_A, 0, 8) + frame(ABORT, b"\x00hidden", code=3),
        "size_error_without_text": setup(POST_SEND, 0, 0, 8) + frame(SIZE_ERROR, channel=P2P),
        "abort_unknown_code": setup(POST_A, 0, 8) + frame(ABORT, text, code=999),
        "abort_text_too_long": setup() + frame(ABORT, b"t" * 64, code=3, length=70000),
        "leave": setup(POST_A, 0, 8) + frame(LEAVE),
        "leave_with_payload": setup(POST_A, 0, 8) + frame(LEAVE, b"x"),
        "frame_after_goodbye": setup(POST_A, 0, 8) + goodbye() + frame(ACK),
        "unknown_kind": setup(POST_A, 0, 8) + frame(9),
        "unknown_channel": setup(POST_A, 0, 8) + frame(DATA, b"x", channel=7),
        "reserved_set": setup(POST_A, 0, 8) + frame(DATA, b"x", reserved=1),
        "bad_magic": setup(POST_A, 0, 8) + frame(DATA, b"x", magic=0x12345678),
        "header_cut_short": setup(POST_A, 0, 8) + frame(DATA, b"12345678")[:40],
        "payload_cut_short": setup(POST_A | ON_P2P, 0, 8) + frame(DATA, b"1234", channel=P2P, length=8),
    }


# ---- shm ----

ACK_ENTRIES = 1024
SLOTS = 8
PAYLOAD = 64 * 1024
EAGER_BYTES = 4096  # segment.hpp: eager_bytes
REFERENCE_BYTES = 4 * 1024 * 1024  # segment.hpp: reference_bytes


def chunk(seq=5, total=0, offset=0, index=0, bytes_=0, channel=P2P, has_signature=0, by_reference=0, eager=0,
          sig=None):
    return struct.pack("<QQQIIBBBB4x", seq, total, offset, index, bytes_, channel, has_signature, by_reference,
                       eager) + (
        sig if sig is not None else signature())


def ack(seq=5, expected=0, index=0, channel=P2P, ok=1):
    return struct.pack("<QQIBB2x", seq, expected, index, channel, ok)


def shm_input(routes=0b000110, slot=3, ack_index=7, chunk_=None, ack_=None, head=5, tail=3, ack_head=10,
              ack_tail=10, abort=(0, 0, 0, 0, 0), sig_seq=3, sig_tag=0, words=None, text=b""):
    words = words if words is not None else signature(seq=sig_seq, count=4, kind=0, algorithm=1, type_=F32, op=SUM)
    return (struct.pack("<BQQ", routes, slot, ack_index) + (chunk_ if chunk_ is not None else chunk(total=400,
                                                                                                   bytes_=400))
            + (ack_ if ack_ is not None else ack()) + struct.pack("<QQQQ", head, tail, ack_head, ack_tail)
            + struct.pack("<IiiQI", *abort) + struct.pack("<QQ", sig_seq, sig_tag) + words + text)


def shm_seeds():
    text = b"rank 1: allreduce timed out"
    return {
        "valid": shm_input(chunk_=chunk(total=100000, offset=PAYLOAD, bytes_=100000 - PAYLOAD),
                           abort=(2, 2, 1, 7, len(text)), sig_tag=4, text=text),
        "valid_with_signature": shm_input(chunk_=chunk(channel=COLLECTIVE, total=8, bytes_=8, has_signature=1,
                                                       sig=signature(seq=5, count=2, kind=0, algorithm=8, type_=F32,
                                                                     op=SUM))),
        "short": b"\x01",
        "chunk_empty_message": shm_input(chunk_=chunk(total=0, bytes_=0)),
        "chunk_bytes_beyond_slot": shm_input(chunk_=chunk(total=400, bytes_=0xFFFFFFFF)),
        "chunk_offset_beyond_total": shm_input(chunk_=chunk(total=400, offset=1 << 40)),
        "chunk_offset_not_a_chunk": shm_input(chunk_=chunk(total=200000, offset=100, bytes_=PAYLOAD)),
        "chunk_total_max": shm_input(chunk_=chunk(total=(1 << 64) - 1, offset=(1 << 64) - PAYLOAD, bytes_=PAYLOAD - 1)),
        "chunk_bad_channel": shm_input(chunk_=chunk(total=400, bytes_=400, channel=7)),
        "chunk_bad_signature_flag": shm_input(chunk_=chunk(total=400, bytes_=400, has_signature=2)),
        "chunk_by_reference": shm_input(chunk_=chunk(total=REFERENCE_BYTES, bytes_=8, by_reference=1)),
        "chunk_eager": shm_input(chunk_=chunk(total=EAGER_BYTES, bytes_=EAGER_BYTES, eager=1)),
        "chunk_eager_beyond_its_limit": shm_input(chunk_=chunk(total=EAGER_BYTES + 1, bytes_=EAGER_BYTES + 1, eager=1)),
        "chunk_eager_collective": shm_input(chunk_=chunk(channel=COLLECTIVE, total=8, bytes_=8, eager=1)),
        "chunk_eager_by_reference": shm_input(chunk_=chunk(total=REFERENCE_BYTES, bytes_=8, by_reference=1, eager=1)),
        "chunk_eager_flag_2": shm_input(chunk_=chunk(total=8, bytes_=8, eager=2)),
        "ack_bad_ok": shm_input(ack_=ack(ok=2)),
        "ack_bad_channel": shm_input(ack_=ack(channel=9)),
        "slot_indices_max": shm_input(slot=(1 << 64) - 1, ack_index=(1 << 64) - 1),
        "ring_tail_past_head": shm_input(head=3, tail=5),
        "ring_full": shm_input(head=SLOTS + 2, tail=2, ack_head=ACK_ENTRIES, ack_tail=0),
        "ring_over_full": shm_input(head=SLOTS + 3, tail=2, ack_head=ACK_ENTRIES + 1, ack_tail=0),
        "abort_being_written": shm_input(abort=(1, 2, 1, 7, len(text)), text=text),
        "abort_length_huge": shm_input(abort=(2, 2, 1, 7, 0xFFFFFFFF), text=text),
        "abort_length_max": shm_input(abort=(2, 4, 0, 9, 1024), text=b"x" * 1024),
        "abort_bad_rank": shm_input(abort=(2, 2, -1, 7, 4), text=b"oops"),
        "abort_bad_code": shm_input(abort=(2, 99, 1, 7, 4), text=b"oops"),
        "abort_without_text": shm_input(abort=(2, 3, 1, 7, 0)),
        "abort_text_starting_with_nul": shm_input(abort=(2, 3, 1, 7, 6), text=b"\x00hidden"),
        "abort_text_with_nul": shm_input(abort=(2, 3, 1, 7, 9), text=b"abc\x00defgh"),
        "signature_garbage": shm_input(sig_seq=0, sig_tag=1, words=b"\xff" * 40),
        "signature_busy": shm_input(sig_seq=2, sig_tag=(1 << 64) - 1),
        "signature_seq_max": shm_input(sig_seq=(1 << 64) - 1, sig_tag=0, words=b"\x01" * 40),
    }


# ---- checkpoint (src/libtorch/checkpoint_bytes.hpp; fuzz_checkpoint.cpp's mode byte) ----

SHARD, MANIFEST, SEAL, OWN_RANK = 0, 1, 2, 4
FLOAT, LONG, DOUBLE, QINT8 = 6, 4, 7, 12


def fnv1a(data):
    h = 14695981039346656037
    for b in data:
        h = ((h ^ b) * 1099511628211) & ((1 << 64) - 1)
    return h


def shard_entry(name, type_, sizes, data, nbytes=None):
    return (struct.pack("<I", len(name)) + name + struct.pack("<iI", type_, len(sizes))
            + b"".join(struct.pack("<q", d) for d in sizes) + struct.pack("<Q", len(data) if nbytes is None else nbytes)
            + data)


def shard(entries, rank=0, world=1, count=None, version=1, magic=b"TUTTICKS"):
    body = magic + struct.pack("<IIII", version, rank, world, len(entries) if count is None else count)
    return body + b"".join(entries)


def sealed(body):
    return body + struct.pack("<Q", fnv1a(body))


def manifest_text(world=1, shards=((859, 0x56436df2592c2aa5),), extra=b""):
    text = (b"tutti-checkpoint 1\nworld_size %d\noptimizer torch::optim::SGD\nmeta epoch 1\n"
            b"meta optimizer_steps 2\nparam fc1.weight Float[4,5]\nparam fc1.bias Float[4]\n" % world) + extra
    for r, (size, checksum) in enumerate(shards):
        text += b"shard %d %d %016x\n" % (r, size, checksum)
    return text


def checkpoint_seeds():
    weight = shard_entry(b"param/w", FLOAT, [2, 3], struct.pack("<6f", *range(6)))
    step = shard_entry(b"state/w/step", LONG, [1], struct.pack("<q", 5))
    group = shard_entry(b"group/0", DOUBLE, [2], struct.pack("<2d", 0.1, 0.9))
    valid = shard([weight, step, group])
    text = manifest_text()
    return {
        "shard_valid": bytes([SHARD]) + sealed(valid),
        "shard_valid_unsealed": bytes([SHARD | SEAL]) + valid,
        "shard_rank_1_of_2": bytes([SHARD | SEAL | OWN_RANK]) + shard([weight], rank=1, world=2),
        "shard_other_rank": bytes([SHARD | SEAL]) + shard([weight], rank=3, world=4),
        "shard_empty": bytes([SHARD | SEAL]) + shard([]),
        "shard_scalar": bytes([SHARD | SEAL]) + shard([shard_entry(b"s", DOUBLE, [], struct.pack("<d", 1.5))]),
        "shard_zero_size": bytes([SHARD | SEAL]) + shard([shard_entry(b"z", FLOAT, [0, 7], b"")]),
        "shard_count_5e7": bytes([SHARD | SEAL]) + shard([], count=50_000_000),
        "shard_count_max": bytes([SHARD | SEAL]) + shard([], count=0xFFFFFFFF),
        "shard_huge_tensor": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", FLOAT, [1 << 40], b"", 4 << 40)]),
        "shard_huge_name": bytes([SHARD | SEAL]) + shard([]) [:-4] + struct.pack("<II", 1, 0xFFFFFFF0),
        "shard_too_many_dims": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", FLOAT, [1] * 17, b"\0" * 4)]),
        "shard_negative_size": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", FLOAT, [-1], b"")]),
        "shard_overflowing_shape": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", FLOAT, [1 << 32, 1 << 32], b"")]),
        "shard_bad_type": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", 99, [1], b"\0")]),
        "shard_quantized_type": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", QINT8, [1], b"\0")]),
        "shard_bytes_not_shape": bytes([SHARD | SEAL]) + shard([shard_entry(b"w", FLOAT, [2], b"\0" * 4)]),
        "shard_trailing_bytes": bytes([SHARD | SEAL]) + valid + b"junk",
        "shard_bad_version": bytes([SHARD | SEAL]) + shard([weight], version=2),
        "shard_bad_magic": bytes([SHARD | SEAL]) + shard([weight], magic=b"NOTASHRD"),
        "shard_bad_checksum": bytes([SHARD]) + valid + b"\0" * 8,
        "shard_short": bytes([SHARD]) + b"TUTTI",
        "manifest_valid": bytes([MANIFEST]) + text + b"checksum %016x\n" % fnv1a(text),
        "manifest_unsealed": bytes([MANIFEST | SEAL]) + text,
        "manifest_two_ranks": bytes([MANIFEST | SEAL]) + manifest_text(2, ((100, 1), (200, 2))),
        "manifest_shards_missing": bytes([MANIFEST | SEAL]) + manifest_text(3, ((100, 1),)),
        "manifest_world_huge": bytes([MANIFEST | SEAL]) + manifest_text(2147483647, ()),
        "manifest_world_overflow": bytes([MANIFEST | SEAL]) + manifest_text(1, (), b"world_size 99999999999\n"),
        "manifest_shard_out_of_order": bytes([MANIFEST | SEAL]) + manifest_text(1, (), b"shard 1 5 00\n"),
        "manifest_shard_no_checksum": bytes([MANIFEST | SEAL]) + manifest_text(1, (), b"shard 0 5\n"),
        "manifest_unknown_line": bytes([MANIFEST | SEAL]) + text + b"owner mallory\n",
        "manifest_bad_checksum": bytes([MANIFEST]) + text + b"checksum 0000000000000000\n",
        "manifest_no_newline": bytes([MANIFEST]) + text + b"checksum %016x" % fnv1a(text),
        "manifest_empty": bytes([MANIFEST]),
        "manifest_wrong_version": bytes([MANIFEST | SEAL]) + b"tutti-checkpoint 2\nworld_size 1\nshard 0 1 1\n",
    }


def write(name, seeds):
    folder = os.path.join(HERE, "corpus", name)
    os.makedirs(folder, exist_ok=True)
    for seed, data in seeds.items():
        with open(os.path.join(folder, seed), "wb") as out:
            out.write(data)


if __name__ == "__main__":
    write("tcp_frame", tcp_seeds())
    write("shm_header", shm_seeds())
    write("checkpoint", checkpoint_seeds())
