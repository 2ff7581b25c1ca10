"""Engine.metrics(): off by default (empty), and with metrics=True the bytes a write moved,
per transport and direction, in the dict and in the Prometheus text."""

import numpy as np

import kvferry


def labels_match(labels, wanted):
    return all(labels.get(k) == v for k, v in wanted.items())


def sample(metrics, name, **wanted):
    return sum(v for labels, v in metrics[name]["samples"] if labels_match(labels, wanted))


def test_metrics_are_off_by_default():
    assert kvferry.Engine().metrics() == {}


def test_a_write_moves_the_bytes_counter_by_its_length():
    engine = kvferry.Engine(name="py", metrics=True)
    src = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8)
    dst = np.zeros_like(src)
    with engine.registered(src, dst) as [(src_addr, _), (dst_addr, _)]:
        engine.write(engine.endpoint, [src_addr], [dst_addr], [40000])
    assert np.array_equal(dst[:40000], src[:40000])
    assert not dst[40000:].any()

    m = engine.metrics()
    assert m["kvferry_engine_bytes_total"]["type"] == "counter"
    assert sample(m, "kvferry_engine_bytes_total", engine="py", transport="local",
                  direction="write") == 40000
    assert sample(m, "kvferry_engine_bytes_total", direction="read") == 0
    [(labels, histogram)] = [s for s in m["kvferry_engine_batch_latency_seconds"]["samples"]
                             if s[0]["transport"] == "local"]
    assert histogram["count"] == 1 and histogram["sum"] > 0
    assert histogram["buckets"][-1][1] <= 1
    text = engine.metrics_text()
    assert ('kvferry_engine_bytes_total{engine="py",transport="local",direction="write"} 40000'
            in text)
