"""The usage writer's pause between batches (extproc.usage_writer.pause_after): short under a light load,
longer once batches fill, none when a batch came back full."""
from extproc.usage_writer import BATCH, BUSY, pause_after


def test_a_light_load_waits_20_ms() -> None:
    assert pause_after(0) == 0.02
    assert pause_after(1) == 0.02
    assert pause_after(BUSY - 1) == 0.02


def test_a_busy_load_waits_100_ms_so_records_share_a_transaction() -> None:
    assert BUSY == 16
    assert pause_after(BUSY) == 0.1
    assert pause_after(BATCH - 1) == 0.1


def test_a_full_batch_is_followed_at_once() -> None:
    assert BATCH == 500
    assert pause_after(BATCH) == 0.0
