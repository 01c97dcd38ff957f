#!/usr/bin/python3
"""A second, independent decoder of TensorBoard event files, used to cross-check psflow's writer.

It shares nothing with the C++ code: the record framing, the masked CRC-32C (computed bit by bit
here, where the C++ side uses a table) and the protobuf wire format (varints, fixed64/fixed32,
length-delimited fields) are all parsed by hand with the standard library, because the test
machines have neither tensorflow nor tensorboard.

Usage: decode_events.py EVENT_FILE
Prints one tab-separated line per item, in file order:
  file_version <step> <version>
  scalar       <step> <tag> <float32 bits as 0x%08x> <value>
  session_log  <step> <status number>
Exits 1 with a message naming the record and the failed check on any corruption.
"""
import struct
import sys

CASTAGNOLI_REFLECTED = 0x82F63B78


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (CASTAGNOLI_REFLECTED if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class DecodeError(Exception):
    pass


def read_varint(buf: bytes, pos: int):
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("varint runs past the end of its message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def fields(buf: bytes):
    """Yields (field number, wire type, raw value) for every field of one message."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = read_varint(buf, pos)
        elif wire_type == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire_type == 2:
            length, pos = read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire_type == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise DecodeError(f"unsupported wire type {wire_type} for field {number}")
        if pos > len(buf):
            raise DecodeError(f"field {number} runs past the end of its message")
        yield number, wire_type, value


def to_int64(varint: int) -> int:
    return varint - (1 << 64) if varint >= (1 << 63) else varint


def decode_event(payload: bytes):
    step = 0
    lines_after_step = []  # (kind, fields...) without the step, which may come later in the message
    for number, wire_type, value in fields(payload):
        if number == 2 and wire_type == 0:  # int64 step
            step = to_int64(value)
        elif number == 3 and wire_type == 2:  # string file_version
            lines_after_step.append(("file_version", value.decode("utf-8")))
        elif number == 5 and wire_type == 2:  # Summary summary
            for vnumber, vwire, summary_value in fields(value):
                if vnumber != 1 or vwire != 2:  # repeated Value value = 1
                    continue
                tag, bits = None, None
                for f, w, v in fields(summary_value):
                    if f == 1 and w == 2:  # string tag
                        tag = v.decode("utf-8")
                    elif f == 2 and w == 5:  # float simple_value
                        bits = struct.unpack("<I", v)[0]
                if tag is not None and bits is not None:
                    number_value = struct.unpack("<f", struct.pack("<I", bits))[0]
                    lines_after_step.append(("scalar", tag, f"0x{bits:08x}", repr(number_value)))
        elif number == 7 and wire_type == 2:  # SessionLog session_log
            status = 0
            for f, w, v in fields(value):
                if f == 1 and w == 0:
                    status = v
            lines_after_step.append(("session_log", str(status)))
    return [(kind, str(step), *rest) for kind, *rest in lines_after_step]


def decode_file(data: bytes):
    out = []
    pos = 0
    index = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise DecodeError(f"record {index} at byte {pos}: header cut short")
        length_bytes = data[pos:pos + 8]
        (stored_length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked_crc32c(length_bytes) != stored_length_crc:
            raise DecodeError(f"record {index} at byte {pos}: length CRC mismatch")
        (length,) = struct.unpack("<Q", length_bytes)
        start = pos + 12
        if start + length + 4 > len(data):
            raise DecodeError(f"record {index} at byte {pos}: data cut short")
        payload = data[start:start + length]
        (stored_data_crc,) = struct.unpack("<I", data[start + length:start + length + 4])
        if masked_crc32c(payload) != stored_data_crc:
            raise DecodeError(f"record {index} at byte {pos}: data CRC mismatch")
        try:
            out.extend(decode_event(payload))
        except (DecodeError, UnicodeDecodeError) as e:
            raise DecodeError(f"record {index} at byte {pos}: bad Event protobuf: {e}") from e
        pos = start + length + 4
        index += 1
    return out


def main() -> int:
    # The standard CRC-32C check value; if this fails, nothing below can be trusted.
    assert crc32c(b"123456789") == 0xE3069283
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    try:
        lines = decode_file(data)
    except DecodeError as e:
        print(f"decode_events.py: {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print("\t".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
