"""The batch byte bound and the fetch size: the settings behind the worker's memory
bound (docs/worker.md, "Memory")."""

from __future__ import annotations

import pytest

from stepstream.cli import _settings, build_parser
from stepstream.config import load_settings
from stepstream.errors import ConfigError


def test_batch_bytes_is_a_setting_a_variable_and_a_flag() -> None:
    assert load_settings(environ={}).batch_bytes == 32 * 1024 * 1024
    assert load_settings(environ={"STEPSTREAM_BATCH_BYTES": "1048576"}).batch_bytes == 1_048_576
    args = build_parser().parse_args(["worker", "--batch-bytes", "2097152"])
    assert _settings(args).batch_bytes == 2_097_152
    with pytest.raises(ConfigError, match="batch_bytes"):
        load_settings({"batch_bytes": 0}, environ={})


def test_the_worker_asks_each_partition_for_at_most_one_mebibyte_per_fetch() -> None:
    from stepstream.ingest.app import FETCH_PARTITION_BYTES, create_app

    app = create_app(load_settings({"app_id": "fetch-size-test"}, environ={}))
    assert app.conf.consumer_max_fetch_size == FETCH_PARTITION_BYTES == 1_048_576
