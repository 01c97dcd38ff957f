#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Small valid examples of each format, built here from the format descriptions (not by psflow's
own writers, so a writer bug cannot hide in the seeds). Standard library only. Rerun after
changing a format; the files are committed.
"""
import gzip
import json
import os
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- safetensors: u64 LE header length, JSON header padded to 8 bytes, raw F32 data -------------
def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    for name, shape, values in tensors:
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + blob


write("fuzz_safetensors", "two_tensors", safetensors(
    [("dense/kernel", [2, 3], [0.5, -1, 2, 3.25, 0, 1e-3]), ("dense/bias", [3], [1, 2, 3])],
    {"global_step": "42", "model": "mlp"}))
write("fuzz_safetensors", "scalar_and_empty", safetensors([("step", [], [7.0]), ("none", [0, 4], [])]))
write("fuzz_safetensors", "no_tensors", safetensors([], {}))


# A checkpoint as psflow/ckpt/checkpoint.h stores it: CRC-32 over each tensor's name then its
# bytes, in name order, in the metadata.
def checkpoint(tensors, step):
    crc = 0
    for name, shape, values in sorted(tensors):
        crc = zlib.crc32(struct.pack("<%df" % len(values), *values), zlib.crc32(name.encode(), crc))
    return safetensors(tensors, {"global_step": str(step), "psflow.crc32": str(crc)})


write("fuzz_safetensors", "checkpoint_with_crc", checkpoint(
    [("w", [2, 2], [1, 2, 3, 4]), ("w/slot/m", [2, 2], [0.1, 0.2, 0.3, 0.4]), ("b", [2], [-1, 1])], 7))

# --- IDX: fuzz_idx input = mode byte (0 raw, 1 gzip-compressed by the harness) + file bytes -------
def idx(dims, data):
    return bytes([0, 0, 0x08, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


images = idx([2, 3, 3], range(0, 255, 15)[:18])
labels = idx([4], [7, 2, 1, 0])
write("fuzz_idx", "images_plain", b"\x00" + images)
write("fuzz_idx", "labels_plain", b"\x00" + labels)
write("fuzz_idx", "images_gzip_by_harness", b"\x01" + images)
write("fuzz_idx", "labels_gzip_file", b"\x00" + gzip.compress(labels, mtime=0))
write("fuzz_idx", "zero_rows", b"\x00" + idx([0, 28, 28], []))

# --- TF_CONFIG, host lists (ps \n workers), partitioner and placement flags -----------------------
def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


write("fuzz_tf_config", "chief_worker_ps", tf_config(
    {"chief": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"], "ps": ["localhost:2225"]},
    "worker", 1))
write("fuzz_tf_config", "ps_with_evaluator", tf_config(
    {"worker": ["10.0.0.1:2222"], "ps": ["10.0.0.2:2222", "10.0.0.3:2222"], "evaluator": ["10.0.0.4:2222"]},
    "ps", 1))
write("fuzz_tf_config", "ipv6_chief", tf_config({"chief": ["[::1]:2222"], "ps": ["[fe80::1%eth0]:2223"]}, "chief", 0))
write("fuzz_tf_config", "host_lists", "localhost:2222, 127.0.0.1:2223\nhost-a.example:2224,[::1]:2225")
write("fuzz_tf_config", "partitioner_min_max", "min_max:8:256K")
write("fuzz_tf_config", "partitioner_fixed", "fixed:3")
write("fuzz_tf_config", "partitioner_axis_size", "axis_size:1M")
write("fuzz_tf_config", "placement_greedy", "greedy")

# --- RPC messages: [u32 H][header][u32 L][TensorList][pad to 8][floats], protobuf by hand ---------
def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def tensor_meta(name, shape, rows=None, dtype=None):
    m = field(1, 2, name.encode()) + field(2, 2, b"".join(varint(d) for d in shape))
    if rows is not None:
        m += field(3, 0, varint(1)) + field(4, 2, b"".join(varint(r) for r in rows))
    if dtype is not None:
        m += field(5, 2, dtype.encode())
    return m


def message(header, metas, values, fmt="f"):
    """fmt: struct's code of the values on the wire ("f" float32, "e" float16, "H" raw 16-bit words)."""
    lst = b"".join(field(1, 2, m) for m in metas)
    head = struct.pack("<I", len(header)) + header + struct.pack("<I", len(lst)) + lst
    head += b"\0" * ((8 - len(head) % 8) % 8)
    return head + struct.pack("<%d%s" % (len(values), fmt), *values)


# Control byte: bits 0-1 misalignment, bits 2-3 number of 2-byte cut points that follow.
push = field(1, 0, varint(1)) + field(2, 0, varint(17))  # PushRequest{worker_index: 1, step_tag: 17}
dense = message(push, [tensor_meta("w/part_0", [2, 3]), tensor_meta("b", [3])], [float(i) for i in range(9)])
sparse = message(push, [tensor_meta("emb", [2, 4], rows=[5, 0])], [0.5 * i for i in range(8)])
write("fuzz_tensor_coding", "dense_one_slice", b"\x00" + dense)
write("fuzz_tensor_coding", "dense_three_slices_misaligned", bytes([0x08 | 0x01]) + struct.pack("<HH", 13, 41) + dense)
write("fuzz_tensor_coding", "sparse_two_slices", bytes([0x04 | 0x02]) + struct.pack("<H", 30) + sparse)
write("fuzz_tensor_coding", "header_only", b"\x00" + message(field(1, 0, varint(3)), [], []))
# Larger than ForEachRun's 16 KiB bounce buffer, in misaligned slices: the path that refills it.
big = message(push, [tensor_meta("big", [4100])], [float(i % 7) for i in range(4100)])
write("fuzz_tensor_coding", "bounce_buffer_refill", bytes([0x08 | 0x03]) + struct.pack("<HH", 101, 9001) + big)
# 16-bit tensors (--wire_dtype, two bytes a value, widened when read): bfloat16 words (1, -2, a
# signalling NaN, Inf, the smallest subnormal, -0) and float16 values beside a float32 tensor.
bf16 = message(push, [tensor_meta("w/part_0", [2, 3], dtype="bfloat16")], [0x3f80, 0xc000, 0x7f81, 0x7f80, 0x0001, 0x8000],
               fmt="H")
write("fuzz_tensor_coding", "bfloat16_two_slices", bytes([0x04 | 0x01]) + struct.pack("<H", 37) + bf16)
f16 = message(push, [tensor_meta("b", [4], dtype="float16")], [1.0, -2.5, float("inf"), 6e-8], fmt="e")
write("fuzz_tensor_coding", "float16_one_slice", b"\x00" + f16)
