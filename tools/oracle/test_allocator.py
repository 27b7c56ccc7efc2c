"""Unit tests of the caching-allocator model (plain Python, no torch):
python3 -m unittest discover -s tools/oracle -p 'test_*.py'"""
import unittest

from allocator import Allocator, allocation_size, round_size

MIB = 1 << 20


class Rules(unittest.TestCase):
    def test_round_size(self):
        self.assertEqual(round_size(1), 512)
        self.assertEqual(round_size(512), 512)
        self.assertEqual(round_size(513), 1024)

    def test_segment_sizes(self):
        self.assertEqual(allocation_size(MIB), 2 * MIB)              # small pool
        self.assertEqual(allocation_size(MIB + 512), 20 * MIB)       # 1-10 MiB: kLargeBuffer
        self.assertEqual(allocation_size(10 * MIB - 512), 20 * MIB)
        self.assertEqual(allocation_size(10 * MIB), 10 * MIB)        # kMinLargeAlloc and up: 2 MiB multiples
        self.assertEqual(allocation_size(10 * MIB + 1), 12 * MIB)

    def test_small_requests_share_a_2_mib_segment(self):
        al = Allocator()
        for h in range(4):
            al.malloc(h, 1000)
        self.assertEqual(al.reserved, 2 * MIB)
        self.assertEqual(al.allocated, 4 * 1024)

    def test_mid_requests_share_a_20_mib_segment(self):
        al = Allocator()
        al.malloc(1, 8 * MIB)
        al.malloc(2, 8 * MIB)       # carved from the 12 MiB rest
        self.assertEqual(al.reserved, 20 * MIB)
        al.malloc(3, 8 * MIB)       # 4 MiB left: a new segment
        self.assertEqual(al.reserved, 40 * MIB)

    def test_large_remainder_of_one_mib_is_not_split(self):
        al = Allocator()
        al.malloc(1, 11 * MIB)      # 12 MiB segment, 1 MiB rest: not > kSmallSize, handed out whole
        self.assertEqual(al.allocated, 12 * MIB)
        al = Allocator()
        al.malloc(1, 11 * MIB - 512)    # rest 1 MiB + 512: split
        self.assertEqual(al.allocated, 11 * MIB - 512)

    def test_best_fit_then_merge(self):
        al = Allocator()
        al.malloc(1, 40 * MIB)
        al.malloc(2, 30 * MIB)
        al.free(1)
        al.free(2)                  # separate segments: no merge across them
        al.malloc(3, 25 * MIB)      # best fit: the 30 MiB block
        self.assertEqual(al.live[3].size, 25 * MIB)
        self.assertEqual(al.live[3].seg, 40 * MIB)
        al.free(3)                  # merges back with its 5 MiB rest
        self.assertEqual(al.largest_free(), 40 * MIB)
        self.assertEqual(sorted(s for s, _ in al.pools[False]), [30 * MIB, 40 * MIB])

    def test_a_kept_block_carved_from_a_freed_one_strands_it(self):
        """The prefill's pattern: a layer's big temporary is freed, the next layer's small tensor that stays
        (a KV-cache entry) is carved from its block, and the next big temporary needs a fresh segment."""
        al = Allocator()
        al.malloc("mlp0", 64 * MIB)
        al.free("mlp0")
        al.malloc("kv1", 4 * MIB)   # best fit: the free 64 MiB block, split
        al.malloc("mlp1", 64 * MIB)
        self.assertEqual(al.reserved, 128 * MIB)
        self.assertEqual(al.allocated, 68 * MIB)

    def test_empty_cache_releases_whole_free_segments_only(self):
        al = Allocator()
        al.malloc(1, 40 * MIB)
        al.malloc(2, 8 * MIB)
        al.malloc(3, 8 * MIB)
        al.free(1)
        al.free(2)
        al.empty_cache()
        self.assertEqual(al.reserved, 20 * MIB)     # 40 MiB segment gone; the 20 MiB one holds block 3
        al.reset_peak()
        self.assertEqual(al.peak_reserved, 20 * MIB)

    def test_a_failed_cudamalloc_releases_free_segments_then_reports_oom(self):
        al = Allocator(capacity=100 * MIB)
        al.malloc(1, 60 * MIB)
        al.malloc(2, 30 * MIB)
        al.free(1)
        al.malloc(3, 70 * MIB)      # 90 + 70 > 100: the free 60 MiB segment is released first
        self.assertEqual((al.reserved, al.releases, al.oom), (100 * MIB, 1, False))
        al.malloc(4, 20 * MIB)      # nothing free to release: out of memory
        self.assertTrue(al.oom)


if __name__ == "__main__":
    unittest.main()
