"""The reference fold of raw log records: decode each one and fold it with ``ChainBook``, as the projector must."""

from __future__ import annotations

from collections.abc import Iterable

from throughline.core.fold import ChainBook
from throughline.projector.prepare import RecordLike
from throughline.schemas.codec import decode_record
from throughline.schemas.exceptions import RecordDecodeError


def fold_records(records: Iterable[RecordLike]) -> tuple[ChainBook, list[tuple[int, int]]]:
    """Fold ``records`` in the order given (turns and repairs); the book and the (partition, offset) of
    every record that decodes to nothing (a tombstone, bytes no schema reads), which the projector
    quarantines."""
    book = ChainBook()
    undecodable: list[tuple[int, int]] = []
    for r in records:
        try:
            record = decode_record(r.value) if r.value is not None else None
        except RecordDecodeError:
            record = None
        if record is None:
            undecodable.append((r.partition, r.offset))
            continue
        book.apply_record(record, r.partition, r.offset, r.key)
    return book, undecodable
