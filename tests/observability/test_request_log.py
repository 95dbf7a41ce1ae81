"""The request log: JSON lines like the logging formatter's, following the logger's level,
written in batches (by count, or after a delay on the event loop), and never failing a request
when the stream does."""

from __future__ import annotations

import asyncio
import io
import logging
from datetime import datetime

import orjson
import pytest

from titan.observability.request_log import REQUEST_LOGGER, RequestLog


@pytest.fixture
def info_level():
    logger = logging.getLogger(REQUEST_LOGGER)
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(logging.NOTSET)


def lines(stream: io.StringIO) -> list[dict]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_has_the_formatters_keys_and_leaves_at_once_without_a_loop(info_level):
    stream = io.StringIO()
    RequestLog(lambda: stream).write({"request_id": "r1", "status": 200})
    (line,) = lines(stream)  # no event loop to flush it later: written at once
    assert line["logger"] == REQUEST_LOGGER and line["level"] == "info"
    assert line["msg"] == "request" and line["request_id"] == "r1" and line["status"] == 200
    assert datetime.fromisoformat(line["ts"]).utcoffset().total_seconds() == 0


async def test_on_a_loop_lines_leave_in_batches(info_level):
    stream = io.StringIO()
    log = RequestLog(lambda: stream, max_lines=2, max_delay_s=60)
    log.write({"request_id": "r1"})
    assert stream.getvalue() == ""
    log.write({"request_id": "r2"})  # a full batch
    assert [line["request_id"] for line in lines(stream)] == ["r1", "r2"]


def test_below_the_loggers_level_nothing_is_written():
    logging.getLogger(REQUEST_LOGGER).setLevel(logging.WARNING)
    try:
        stream = io.StringIO()
        log = RequestLog(lambda: stream, max_lines=1)
        log.write({"request_id": "r1"})
        log.flush()
    finally:
        logging.getLogger(REQUEST_LOGGER).setLevel(logging.NOTSET)
    assert stream.getvalue() == ""


async def test_on_a_loop_a_partial_batch_leaves_after_the_delay(info_level):
    stream = io.StringIO()
    log = RequestLog(lambda: stream, max_delay_s=0.05)
    log.write({"request_id": "r1"})
    assert stream.getvalue() == ""
    await asyncio.sleep(0.2)
    assert [line["request_id"] for line in lines(stream)] == ["r1"]


def test_a_broken_stream_drops_lines_without_raising(info_level):
    class Broken:
        def write(self, text: str) -> None:
            raise BrokenPipeError("stderr went away")

        def flush(self) -> None:
            pass

    log = RequestLog(lambda: Broken(), max_lines=2)
    for index in range(3):
        log.write({"request_id": f"r{index}"})  # the second one flushes, and fails
    log.flush()
    assert log.num_dropped == 3
