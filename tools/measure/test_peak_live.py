"""The history walk of peak_live.py on a hand-made trace (no GPU needed)."""
import os, sys, unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peak_live  # noqa: E402


def ev(action, addr, size, name="f"):
    return dict(action=action, addr=addr, size=size, frames=[dict(filename="/x/site-packages/m.py", line=1, name=name)])


class PeakLive(unittest.TestCase):
    def test_the_peak_is_the_base_plus_the_live_blocks_and_names_their_frames(self):
        snap = dict(peakfit_base=dict(allocated=100, reserved=200), device_traces=[[
            ev("segment_alloc", 1000, 64), ev("alloc", 1000, 40, "a"), ev("alloc", 1040, 20, "b"),
            ev("free_completed", 1000, 40), ev("segment_alloc", 2000, 128), ev("alloc", 2000, 100, "c"),
            ev("free_completed", 2000, 100), ev("segment_free", 2000, 128), ev("alloc", 1000, 30, "d"),
        ]])
        s = peak_live.summarize(snap)
        self.assertEqual(s["peak_allocated"], 100 + 20 + 100)
        self.assertEqual(s["peak_event"], 5)
        self.assertEqual(s["live_bytes_from_history"], 120)
        self.assertEqual({b["frames"][0].split()[-1] for b in s["blocks"]}, {"b", "c"})
        self.assertEqual(s["peak_reserved"], 200 + 64 + 128)
        self.assertEqual(sorted(r["size"] for r in s["segments_at_reserved_peak"]), [64, 128])
        asked = {r["size"]: r["asked"] for r in s["segments_at_reserved_peak"]}
        self.assertEqual(asked, {64: 40, 128: 100})
        self.assertTrue(s["blocks"][0]["frames"][0].startswith("m.py:1"))


if __name__ == "__main__":
    unittest.main()
