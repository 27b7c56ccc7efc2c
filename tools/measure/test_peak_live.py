"""The history walk of peak_live.py on a hand-made trace (no GPU needed)."""
import os, sys, unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peak_live  # noqa: E402


def ev(action, addr, size, name="f"):
    return dict(action=action, addr=addr, size=size, frames=[dict(filename="/x/site-packages/m.py", line=1, name=name)])


class PeakLive(unittest.TestCase):
    def test_the_peak_is_the_base_plus_the_live_blocks_and_names_their_frames(self):
        k = 512  # sizes in blocks of the allocator's 512 B
        snap = dict(peakfit_base=dict(allocated=100 * k, reserved=200 * k), device_traces=[[
            ev("segment_alloc", 1000 * k, 64 * k), ev("alloc", 1000 * k, 40 * k, "a"),
            ev("alloc", 1040 * k, 20 * k, "b"), ev("free_completed", 1000 * k, 40 * k),
            ev("segment_alloc", 2000 * k, 128 * k), ev("alloc", 2000 * k, 100 * k, "c"),
            ev("free_completed", 2000 * k, 100 * k), ev("segment_free", 2000 * k, 128 * k),
            ev("alloc", 1000 * k, 30 * k, "d"),
        ]])
        s = peak_live.summarize(snap)
        self.assertEqual(s["peak_allocated"], (100 + 20 + 100) * k)
        self.assertEqual(s["peak_event"], 5)
        self.assertEqual(s["live_bytes_from_history"], 120 * k)
        self.assertEqual({b["frames"][0].split()[-1] for b in s["blocks"]}, {"b", "c"})
        self.assertEqual(s["peak_reserved"], (200 + 64 + 128) * k)
        self.assertEqual(sorted(r["size"] for r in s["segments_at_reserved_peak"]), [64 * k, 128 * k])
        asked = {r["size"]: r["asked"] for r in s["segments_at_reserved_peak"]}
        self.assertEqual(asked, {64 * k: 40 * k, 128 * k: 100 * k})
        self.assertTrue(s["blocks"][0]["frames"][0].startswith("m.py:1"))


    def test_a_request_counts_as_its_512_byte_block(self):
        snap = dict(peakfit_base=dict(allocated=0, reserved=0), device_traces=[[
            ev("segment_alloc", 0, 2 << 20), ev("alloc", 0, 1), ev("alloc", 512, 513),
        ]])
        self.assertEqual(peak_live.summarize(snap)["peak_allocated"], 512 + 1024)


if __name__ == "__main__":
    unittest.main()
