"""PyTorch's CUDA caching allocator (torch 2.11, `c10/cuda/CUDACachingAllocator.cpp`), as a model.

Fed the oracle's stream of storage allocations and frees in the order the run makes them, it hands out
blocks by the allocator's rules and counts the segments it would have to `cudaMalloc`: their peak is
`torch.cuda.max_memory_reserved()`. Only the default configuration is modelled, the one `measure.py`
runs under: one stream, `max_split_size` unlimited, no `roundup_power2_divisions`, no garbage
collection threshold, expandable segments off, no memory fraction, and no allocation that fails (an
H200 runs out on none of the measured rows), with one exception kept: a `cudaMalloc` beyond the device's
`capacity` fails, and the allocator then releases every cached segment that is one free block and tries
again (`release_cached_blocks`; `release_available_cached_blocks` does nothing with `max_split_size`
unlimited); if that is not enough the run is out of memory (`oom`), and the model goes on counting.

The rules, each as the allocator's code has it:
- `round_size`: a request is rounded up to a multiple of `kMinBlockSize` (512 B), at least 512 B.
- `get_pool`: requests of at most `kSmallSize` (1 MiB) go to the small pool, the rest to the large one.
- `get_free_block`: best fit: the smallest free block of the pool (same stream) at least as large, ties
  to the lower address (`BlockComparatorSize`: stream, size, then pointer).
- `get_allocation_size` (no fit): small pool 2 MiB segments (`kSmallBuffer`); large requests under
  `kMinLargeAlloc` (10 MiB) a 20 MiB segment (`kLargeBuffer`); larger ones their size rounded up to
  `kRoundLarge` (2 MiB).
- `should_split`: the rest of the block stays a free block when it is at least 512 B (small pool) or
  more than 1 MiB (large pool); otherwise the whole block is handed out (and counted as allocated).
- `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours in its segment.
- `release_cached_blocks` (`emptyCache`): drops the segments that are one free block.
"""
import bisect

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20


def round_size(n):
    return K_MIN_BLOCK if n < K_MIN_BLOCK else (n + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def allocation_size(size):
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


class Block:
    __slots__ = ("addr", "size", "small", "free", "prev", "next", "seg")

    def __init__(self, addr, size, small, seg):
        self.addr, self.size, self.small, self.seg = addr, size, small, seg
        self.free, self.prev, self.next = True, None, None


class Allocator:
    """One device, one stream. `malloc(handle, nbytes)` / `free(handle)`; `reserved`, `allocated` and their
    peaks are what `torch.cuda.memory_stats()` would report (`reserved_bytes.all`, `allocated_bytes.all`)."""

    def __init__(self, capacity=None):
        self.capacity = capacity              # bytes cudaMalloc can hand out (None: unlimited)
        self.oom = False
        self.releases = 0                     # cudaMalloc failures answered by release_cached_blocks
        self.pools = {True: [], False: []}    # small? -> sorted [(size, addr)] of free blocks
        self.blocks = {}                      # addr -> free Block (in a pool)
        self.live = {}                        # handle -> allocated Block
        self.next_addr = 0
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.segments = {True: 0, False: 0}   # bytes reserved per pool
        self.mallocs = 0                      # cudaMalloc calls (segments made)

    def _insert(self, b):
        bisect.insort(self.pools[b.small], (b.size, b.addr))
        self.blocks[b.addr] = b

    def _remove(self, b):
        pool = self.pools[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr))
        del pool[i]
        del self.blocks[b.addr]

    def malloc(self, handle, nbytes):
        if nbytes <= 0:                       # an empty tensor: no block
            return None
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            b = self.blocks[pool[i][1]]
            self._remove(b)
        else:
            seg = allocation_size(size)
            if self.capacity is not None and self.reserved + seg > self.capacity:
                self.releases += 1
                self.empty_cache()
                if self.reserved + seg > self.capacity:
                    self.oom = True
            b = Block(self.next_addr, seg, small, self.next_addr)
            self.next_addr += seg
            self.reserved += seg
            self.segments[small] += seg
            self.mallocs += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = b.size - size
        if (rest >= K_MIN_BLOCK) if small else (rest > K_SMALL_SIZE):
            r = Block(b.addr + size, rest, small, b.seg)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next = r
            b.size = size
            self._insert(r)
        b.free = False
        self.live[handle] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b

    def free(self, handle):
        b = self.live.pop(handle, None)
        if b is None:
            return
        self.allocated -= b.size
        b.free = True
        p = b.prev
        if p is not None and p.free:
            self._remove(p)
            self._absorb_next(p)
            b = p
        n = b.next
        if n is not None and n.free:
            self._remove(n)
            self._absorb_next(b)
        self._insert(b)

    @staticmethod
    def _absorb_next(b):
        """`try_merge_blocks`: b takes over its next neighbour's bytes (b keeps the lower address)."""
        n = b.next
        b.size += n.size
        b.next = n.next
        if n.next is not None:
            n.next.prev = b

    def empty_cache(self):
        """`torch.cuda.empty_cache()`: release every segment that is one free block."""
        for small in (True, False):
            for size, addr in list(self.pools[small]):
                b = self.blocks[addr]
                if b.prev is None and b.next is None:
                    self._remove(b)
                    self.reserved -= size
                    self.segments[small] -= size

    def reset_peak(self):
        """`torch.cuda.reset_peak_memory_stats()`: the peaks restart at the current values."""
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    def largest_free(self):
        return max((p[-1][0] for p in self.pools.values() if p), default=0)
