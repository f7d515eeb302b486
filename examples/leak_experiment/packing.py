"""Packs byte-level documents into fixed-length rows with cu_seqlens, as the leak experiment trains.

Documents are taken in order; a document longer than the space left in a row is split, and each
piece is a document of its own (its positions restart at 0, as a causal model sees a new sequence).
Every byte of every document lands in exactly one row; the last row is dropped when it is not full,
so every row has exactly `row_tokens` tokens. Deterministic: no shuffling here (the training script
chooses the row order with its own seed).
"""
import struct


def read_offsets(path):
    data = open(path, "rb").read()
    return list(struct.unpack(f"<{len(data) // 8}q", data))


def pack(offsets, row_tokens):
    """Returns a list of rows, each a list of (start, end) byte spans into the corpus; the spans of
    one row are its documents, in order, and their lengths sum to row_tokens."""
    if row_tokens < 1:
        raise ValueError(f"row_tokens must be >= 1, got {row_tokens}")
    rows, row, used = [], [], 0
    for start, end in zip(offsets[:-1], offsets[1:]):
        while start < end:
            take = min(end - start, row_tokens - used)
            row.append((start, start + take))
            used += take
            start += take
            if used == row_tokens:
                rows.append(row)
                row, used = [], 0
    return rows


def cu_seqlens(row):
    """cu_seqlens of one packed row: 0, then the running sum of its document lengths."""
    out = [0]
    for start, end in row:
        out.append(out[-1] + end - start)
    return out
