//! PyTorch's CUDA caching allocator as far as the slack terms need it (torch 2.11,
//! `c10/cuda/CUDACachingAllocator.cpp`, default configuration: one stream, `max_split_size`
//! unlimited, expandable segments off), the rules `tools/oracle/allocator.py` replays:
//!
//! | rule | what it does | code |
//! |---|---|---|
//! | block rounding | a request becomes a block of a multiple of 512 B, at least 512 B | `round_size` (`kMinBlockSize`) |
//! | pools | blocks of at most 1 MiB come from the small pool, larger ones from the large pool; neither serves the other | `get_pool` (`kSmallSize`) |
//! | segment size | a request no cached block fits makes a segment: 2 MiB for the small pool, 20 MiB for a large block under 10 MiB, else the block rounded up to 2 MiB | `get_allocation_size` (`kSmallBuffer`, `kLargeBuffer`, `kMinLargeAlloc`, `kRoundLarge`) |
//! | splitting | the rest of a block stays a free block when it is at least 512 B (small pool) or more than 1 MiB (large pool) | `should_split` |
//! | best fit | a request takes the smallest free block of its pool that holds it | `get_free_block` (`BlockComparatorSize`) |
//!
//! The terms that use these rules (`hf::slack`) say which of the workload's requests meet which
//! free blocks; this module only answers how the allocator sizes and splits them.

const MIN_BLOCK: f64 = 512.0;
const SMALL_SIZE: f64 = 1_048_576.0;
const SMALL_BUFFER: f64 = 2.0 * SMALL_SIZE;
const LARGE_BUFFER: f64 = 20.0 * SMALL_SIZE;
/// The smallest block that gets a segment of its own (`kMinLargeAlloc`).
pub(super) const MIN_LARGE_ALLOC: f64 = 10.0 * SMALL_SIZE;
/// The rounding of a segment made for one large block (`kRoundLarge`).
pub(super) const ROUND_LARGE: f64 = 2.0 * SMALL_SIZE;

/// The block a request of `bytes` gets (`round_size`).
pub(super) fn block(bytes: f64) -> f64 {
    (bytes / MIN_BLOCK).ceil().max(1.0) * MIN_BLOCK
}

/// Floats below this hold every whole number, so whole-byte arithmetic below it is exact.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// A request's block and the segment a miss makes for it, in whole bytes: [`block`] and
/// [`segment`] without a float division, `ceil` or a float-to-integer conversion each (the
/// prefill replay asks this of every request, thousands a call: issue 20's 1 ms per call; `ceil`
/// is a library call on the baseline x86-64 target). The same numbers as
/// `f64_to_u64(block(bytes))` and `f64_to_u64(segment(block(bytes)))` for every request
/// above 0 and below 2^53 B (`ceil(x / 512) = ceil(ceil(x) / 512)`, and every step exact there);
/// `None` beyond, where the caller takes the float rules.
pub(super) fn block_and_segment(bytes: f64) -> Option<(u64, u64)> {
    if !(bytes > 0.0 && bytes < EXACT) {
        return None;
    }
    let whole = crate::convert::f64_to_u64(bytes);
    #[expect(clippy::cast_precision_loss, reason = "exact below 2^53")]
    let whole = if (whole as f64) < bytes {
        whole + 1
    } else {
        whole
    };
    let block = whole.div_ceil(512).max(1) * 512;
    let segment = if block <= SMALL_BYTES {
        2 * SMALL_BYTES
    } else if block < 10 * SMALL_BYTES {
        20 * SMALL_BYTES
    } else {
        block.div_ceil(2 * SMALL_BYTES) * (2 * SMALL_BYTES)
    };
    Some((block, segment))
}

/// `kSmallSize` in bytes.
pub(super) const SMALL_BYTES: u64 = 1_048_576;

/// Whether a block comes from the small pool (`get_pool`).
pub(super) fn small(block: f64) -> bool {
    block <= SMALL_SIZE
}

/// The segment `cudaMalloc` makes for a block no cached block fits (`get_allocation_size`).
pub(super) fn segment(block: f64) -> f64 {
    if small(block) {
        SMALL_BUFFER
    } else if block < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        (block / ROUND_LARGE).ceil() * ROUND_LARGE
    }
}

/// Whether a block gets a segment of its own rounded up to 2 MiB when no cached block fits it
/// (`get_allocation_size`: at least `kMinLargeAlloc`), rather than a share of a 2 MiB or 20 MiB
/// one.
pub(super) fn rounded_alone(block: f64) -> bool {
    block >= MIN_LARGE_ALLOC
}

/// How many blocks of size `block` one free block of `free` bytes serves: each request splits
/// off what it takes (`should_split`), and the last one takes the rest whole when that is too
/// small to split, which still holds it.
pub(super) fn fits(free: f64, block: f64) -> f64 {
    (free / block).floor().max(0.0)
}

/// Bytes of fresh segments for `n` requests of `block` bytes that no cached block holds: a
/// segment under 10 MiB's worth of block (2 MiB small, 20 MiB large) is split among as many
/// of them as it holds; a larger one holds one, with at most 2 MiB spare.
pub(super) fn fresh(n: f64, block: f64) -> f64 {
    if n <= 0.0 {
        return 0.0;
    }
    let seg = segment(block);
    (n / fits(seg, block).max(1.0)).ceil() * seg
}

/// Whether the `rest` bytes a request leaves of a free block stay a free block of their own
/// (`should_split`): at least 512 B in the small pool, more than 1 MiB in the large one; a
/// smaller rest is handed out with the request.
pub(super) fn splits(rest: u64, small: bool) -> bool {
    let rest = rest as f64;
    if small {
        rest >= MIN_BLOCK
    } else {
        rest > SMALL_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1_048_576.0;

    #[test]
    fn requests_round_to_512_bytes_and_segments_to_the_pools_sizes() {
        assert_eq!(block(1.0), 512.0);
        assert_eq!(block(513.0), 1024.0);
        assert!(small(MIB) && !small(MIB + 512.0));
        assert_eq!(segment(4096.0), 2.0 * MIB);
        assert_eq!(segment(3.0 * MIB), 20.0 * MIB);
        // Qwen3-0.6B, batch 32 x 8,128: a layer's key one token longer, 508.06 MiB, gets a
        // 510 MiB segment (docs/oracle.md, "Why the model reads low on three rows").
        assert_eq!(segment(block(532_676_608.0 + 65_536.0)), 510.0 * MIB);
    }

    #[test]
    fn only_blocks_of_10_mib_or_more_get_a_rounded_segment_of_their_own() {
        assert!(!rounded_alone(10.0 * MIB - 512.0));
        assert!(rounded_alone(10.0 * MIB));
        assert_eq!(segment(10.0 * MIB + 512.0), 12.0 * MIB);
    }

    #[test]
    fn small_blocks_share_a_segment_and_large_ones_take_their_own() {
        // Six 3 MiB blocks fit six to a 20 MiB segment; seven need two.
        assert_eq!(fresh(6.0, 3.0 * MIB), 20.0 * MIB);
        assert_eq!(fresh(7.0, 3.0 * MIB), 40.0 * MIB);
        assert_eq!(fresh(2.0, 100.0 * MIB), 200.0 * MIB);
        assert_eq!(fresh(0.0, 100.0 * MIB), 0.0);
        // A free block one byte short of three holds two.
        assert_eq!(fits(3.0 * 100.0 * MIB - 1.0, 100.0 * MIB), 2.0);
    }

    /// The whole-byte rules return the float rules' numbers: around every boundary (512 B, the
    /// pools' 1 MiB, `kMinLargeAlloc`, the 2 MiB rounding), fractions of a byte, and sizes up to
    /// the largest whole float below 2^53.
    #[test]
    fn whole_byte_blocks_and_segments_are_the_float_rules() {
        let float = |bytes: f64| {
            let b = block(bytes);
            (
                crate::convert::f64_to_u64(b),
                crate::convert::f64_to_u64(segment(b)),
            )
        };
        let mut cases = vec![0.25, 0.5, 1.0, 511.5, 1e-300, EXACT - 1.0, EXACT - 512.0];
        for edge in [512.0, MIB, 10.0 * MIB, 2.0 * MIB, 12.0 * MIB, 3e9, 7.5e12] {
            for delta in [
                -513.0, -512.0, -511.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 511.0, 512.0,
            ] {
                cases.push(edge + delta);
            }
        }
        for bytes in cases.into_iter().filter(|&b| b > 0.0) {
            assert_eq!(block_and_segment(bytes), Some(float(bytes)), "{bytes}");
        }
        for outside in [0.0, -1.0, f64::NAN, EXACT, f64::INFINITY] {
            assert_eq!(block_and_segment(outside), None, "{outside}");
        }
    }

    #[test]
    fn a_large_block_keeps_the_request_whole_unless_more_than_1_mib_is_left() {
        assert!(!splits(1_048_576, false));
        assert!(splits(1_048_576 + 512, false));
        assert!(splits(512, true));
        assert!(!splits(0, true));
    }
}
