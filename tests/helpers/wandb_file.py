"""Reading a W&B offline run file (`run-<id>.wandb`) without a network or a W&B server.

wandb 0.31 writes the file from its Go core and ships no Python reader, so this is one. The format:
a 7-byte file header (`:W&B`, magic 0xBEE1 as uint16 little endian, version byte 0), then the file
read as 32 KiB blocks counted from offset 0 (the header sits inside the first block), each block a
run of LevelDB-log chunks: crc32 uint32 LE, length uint16 LE, type byte (1 full, 2 first, 3 middle,
4 last) and the payload; a block's last < 7 bytes are zero padding. A record's chunks joined give a
serialized `wandb_internal_pb2.Record`. The checksum is plain zlib CRC-32 of the type byte and the
chunk payload (not LevelDB's masked CRC-32C), so it is verified: it costs one C call per chunk.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

from wandb.proto import wandb_internal_pb2

FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, type
BLOCK_LEN = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def iter_records(path: str | Path) -> Iterator[wandb_internal_pb2.Record]:
    """Yield every record of the run file at `path`, in the order written.

    Raises ValueError (one line naming the file) on a bad file header, a chunk header or payload cut
    off by the end of the file, a checksum mismatch, an unknown chunk type, or a record whose
    first/middle/last chunks are out of order or never finished.
    """
    path = Path(path)
    with open(path, "rb") as f:
        header = f.read(FILE_HEADER.size)
        if len(header) < FILE_HEADER.size or FILE_HEADER.unpack(header)[:2] != (IDENT, MAGIC):
            raise ValueError(f"{path}: not a W&B run file (header {header!r})")
        if (version := FILE_HEADER.unpack(header)[2]) != VERSION:
            raise ValueError(f"{path}: W&B run file version {version}, this reader knows {VERSION}")
        pending: list[bytes] | None = None  # chunks of a record begun by FIRST and not yet ended
        block_start, pos = 0, FILE_HEADER.size
        block = header + f.read(BLOCK_LEN - FILE_HEADER.size)
        while True:
            offset = block_start + pos
            if len(block) - pos < CHUNK_HEADER.size:
                # Fewer than 7 bytes left: the block's zero trailer, or the end of the file.
                if len(block) < BLOCK_LEN:
                    if block[pos:].strip(b"\0"):
                        raise ValueError(f"{path}: truncated chunk header at offset {offset}")
                    break
                block_start += len(block)
                block, pos = f.read(BLOCK_LEN), 0
                continue
            crc, length, kind = CHUNK_HEADER.unpack_from(block, pos)
            if kind == 0 and length == 0 and crc == 0:  # zero padding: the rest of the block is unused
                pos = len(block)
                continue
            data = block[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length]
            if len(data) < length:
                raise ValueError(f"{path}: truncated record at offset {offset} ({len(data)} of {length} bytes)")
            if zlib.crc32(data, zlib.crc32(bytes([kind]))) != crc:
                raise ValueError(f"{path}: checksum mismatch in the record at offset {offset}")
            pos += CHUNK_HEADER.size + length
            if kind not in (FULL, FIRST, MIDDLE, LAST):
                raise ValueError(f"{path}: unknown chunk type {kind} at offset {offset}")
            if (kind in (FULL, FIRST)) != (pending is None):
                raise ValueError(f"{path}: chunk type {kind} out of order at offset {offset}")
            if kind != FULL:  # a record too long for the rest of its block, spread over later ones
                pending = [] if kind == FIRST else pending
                pending.append(data)
                if kind != LAST:
                    continue
                data, pending = b"".join(pending), None
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            yield record
        if pending is not None:
            raise ValueError(f"{path}: truncated record at the end of the file (no last chunk)")


def _key(item: Any) -> str:
    # The Go core writes most keys as `nested_key` paths: a media value arrives as one item per field,
    # e.g. ["tables/ppl", "_type"]; plain `key` is what older writers and the config use.
    return "/".join(item.nested_key) if item.nested_key else item.key


def _value(item: Any) -> Any:
    # HistoryItem also has a typed `value` oneof, but wandb 0.31 writes only value_json to the file.
    return json.loads(item.value_json)


def history(path: str | Path) -> list[dict]:
    """The history rows of the run file in file (step) order, each {key: decoded value}.

    Nested keys are joined by "/", so a media value is flat fields, e.g. "figures/loss/_type".
    """
    return [
        {_key(item): _value(item) for item in r.history.item}
        for r in iter_records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def run_summary(path: str | Path) -> dict:
    """{key: decoded value} from history rows and summary updates in file order, the last value winning.

    A summary `remove` drops the key. Media values are flat fields, e.g. "figures/loss/_type".
    """
    summary: dict[str, Any] = {}
    for r in iter_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            summary.update({_key(item): _value(item) for item in r.history.item})
        elif kind == "summary":
            summary.update({_key(item): _value(item) for item in r.summary.update})
            for item in r.summary.remove:
                summary.pop(_key(item), None)
    return summary


def logged_media(path: str | Path) -> dict[str, str]:
    """{key: W&B media "_type"} (e.g. "table-file", "image-file") for every media value logged to history
    or summary: an item whose path ends in "_type", or one whose decoded value is a dict with "_type"."""
    media: dict[str, str] = {}
    for r in iter_records(path):
        kind = r.WhichOneof("record_type")
        items = r.history.item if kind == "history" else r.summary.update if kind == "summary" else ()
        for item in items:
            value = _value(item)
            if isinstance(value, dict) and isinstance(value.get("_type"), str):
                media[_key(item)] = value["_type"]
            elif len(item.nested_key) > 1 and item.nested_key[-1] == "_type" and isinstance(value, str):
                # Judged on the path's parts, not the joined key: a key may itself hold "/" ("tables/ppl").
                media["/".join(item.nested_key[:-1])] = value
    return media


def run_config(path: str | Path) -> dict:
    """{key: decoded value} of the run's config: the run record's, then later config updates and removes.

    Includes wandb's own "_wandb" entry; nested keys are joined by "/".
    """
    config: dict[str, Any] = {}
    for r in iter_records(path):
        kind = r.WhichOneof("record_type")
        updates = r.run.config if kind == "run" else r.config if kind == "config" else None
        if updates is not None:
            config.update({_key(item): json.loads(item.value_json) for item in updates.update})
            for item in updates.remove:
                config.pop(_key(item), None)
    return config
