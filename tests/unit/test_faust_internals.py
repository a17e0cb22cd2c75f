"""faust internals the batch consumer relies on (``stepstream.ingest.consumer``).

Batch delivery touches private names of faust-streaming 0.15.3 (and of aiokafka: the
isolation level, the positions). This test pins the
version and the source of every one of them, and fails naming the internal that
changed: read the new source, check the batch consumer still holds (see the module
docstring of ``stepstream.ingest.consumer`` for what each is used for), then update
the hash here.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from typing import Any

import faust
import pytest

from stepstream.ingest.consumer import FAUST_INTERNALS

PINNED_VERSION = "0.15.3"

SOURCE_SHA256_16 = {
    "faust.transport.consumer.Consumer._drain_messages": "44a2500309e83c63",
    "faust.transport.consumer.Consumer._wait_next_records": "6218e1969a636b3f",
    "faust.transport.consumer.Consumer._new_offset": "1d2c7ea89a7ad4f1",
    "faust.transport.consumer.Consumer._filter_tps_with_pending_acks": "f6f9239774234e7e",
    "faust.transport.consumer.Consumer._filter_committable_offsets": "dc5e9baf5d994485",
    "faust.transport.consumer.Consumer._should_commit": "5ce941793947ad42",
    "faust.transport.consumer.Consumer.commit": "a354437baaa08bf8",
    "faust.transport.consumer.Consumer.on_stop": "45b1d2210ce2b526",
    "faust.transport.consumer.Consumer.perform_seek": "0e8c130ff4b0afd8",
    "faust.transport.consumer.Consumer.seek": "b86a9fe05f956b30",
    "faust.transport.drivers.aiokafka.Consumer.verify_event_path": "a17e8f0610e1abcb",
    "faust.transport.drivers.aiokafka.Transport.Consumer": "959f899e8ebfdd56",
    "faust.app.base.App.transport": "faf137f34d512f4e",
    "faust.app.base.App._on_partitions_revoked": "d5c895bbe57dc73a",
    "faust.app.base.App.on_stop": "bfe5a933defb2324",
    "faust.app.base.App._on_rebalance_when_stopped": "1b172d9af8ff4eb6",
    "faust.tables.manager.TableManager.on_start": "365dd25fbc0e0684",
    "faust.tables.manager.TableManager._update_channels": "88e3941facc934d6",
    "faust.tables.manager.TableManager.recovery": "f0bf5de78b4c3d23",
    "faust.transport.drivers.aiokafka.Consumer._new_consumer_thread": "0870ec53dea75083",
    "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._create_worker_consumer": "c2701bfc3e6f6cad",
    "aiokafka.consumer.subscription_state.Assignment.state_value": "183fea82ef48f3e6",
    "aiokafka.consumer.subscription_state.TopicPartitionState.position": "816b6b289bd14f5c",
    "faust.transport.drivers.aiokafka.Producer._ensure_producer": "5592a4bbdf251325",
}
# Instance attributes: checked by where faust assigns them.
ASSIGNED_IN = {
    "faust.transport.consumer.Consumer._committed_offset": (
        "faust.transport.consumer.Consumer.perform_seek", "self._committed_offset.update(committed_offsets)"
    ),
    "faust.transport.consumer.Consumer._read_offset": ("faust.transport.consumer.Consumer.__init__", "self._read_offset ="),
    "faust.app.base.App.consumer_generation_id": (
        "faust.transport.drivers.aiokafka.ConsumerRebalanceListener.on_partitions_assigned",
        "self._thread.app.consumer_generation_id = generation",
    ),
    "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._consumer": (
        "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread.on_start",
        "self._consumer = self._create_consumer(loop=self.thread_loop)",
    ),
    "aiokafka.consumer.consumer.AIOKafkaConsumer._isolation_level": (
        "aiokafka.consumer.consumer.AIOKafkaConsumer.start", "isolation_level=self._isolation_level,"
    ),
    "aiokafka.consumer.consumer.AIOKafkaConsumer._subscription": (
        "aiokafka.consumer.consumer.AIOKafkaConsumer.__init__", "self._subscription = SubscriptionState(loop=loop)"
    ),
}


def _resolve(name: str) -> Any:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = inspect.getattr_static(obj, attr) if isinstance(obj, type) else getattr(obj, attr)
        return obj
    raise ImportError(name)


def _source(obj: Any) -> str:
    return inspect.getsource(obj.fget if isinstance(obj, property) else obj)


def test_faust_is_the_pinned_version():
    assert faust.__version__ == PINNED_VERSION, (
        f"faust-streaming {faust.__version__} is installed; the batch consumer was checked against "
        f"{PINNED_VERSION} (pyproject pins it)"
    )


def test_every_internal_we_use_is_listed_here():
    assert {name for name, _ in FAUST_INTERNALS} == set(SOURCE_SHA256_16) | set(ASSIGNED_IN)


@pytest.mark.parametrize("name", sorted(SOURCE_SHA256_16))
def test_internal_source_is_unchanged(name):
    try:
        obj = _resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"faust internal {name} is gone ({exc!r})")
    digest = hashlib.sha256(_source(obj).encode()).hexdigest()[:16]
    assert digest == SOURCE_SHA256_16[name], f"faust internal {name} changed: review stepstream.ingest.consumer"


@pytest.mark.parametrize("name", sorted(ASSIGNED_IN))
def test_internal_attribute_is_still_assigned(name):
    where, text = ASSIGNED_IN[name]
    assert text in _source(_resolve(where)), f"faust no longer sets {name} in {where}"
