"""Index events for whoever listens (the `events` op: editor plugins, `ragctl watch`).

Each subscriber has a bounded queue; a subscriber that does not keep up loses the oldest events
and is told how many it lost, so a slow reader never holds the indexer back.
"""

from __future__ import annotations

import collections
import threading
import time

QUEUE = 1000


class Subscription:
    def __init__(self, bus: "EventBus"):
        self.bus = bus
        self.queue: collections.deque[dict] = collections.deque(maxlen=QUEUE)
        self.lost = 0
        self.cv = threading.Condition()

    def get(self, timeout: float) -> dict | None:
        with self.cv:
            if not self.queue:
                self.cv.wait(timeout)
            if not self.queue:
                return None
            event = self.queue.popleft()
            if self.lost:
                event = {**event, "lost_before": self.lost}
                self.lost = 0
            return event

    def close(self) -> None:
        self.bus.unsubscribe(self)


class EventBus:
    def __init__(self):
        self._subs: set[Subscription] = set()
        self._lock = threading.Lock()

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        with self._lock:
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def publish(self, kind: str, **fields) -> None:
        with self._lock:
            subs = list(self._subs)
        if not subs:
            return
        event = {"event": kind, "time": time.time(), **fields}
        for sub in subs:
            with sub.cv:
                if len(sub.queue) == sub.queue.maxlen:
                    sub.lost += 1
                sub.queue.append(event)
                sub.cv.notify()
