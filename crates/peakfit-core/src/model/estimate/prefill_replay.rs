//! The prefill of a decoder's `generate`, replayed request by request through the caching
//! allocator, for the reserved memory it leaves (issue 20).
//!
//! Reserved − allocated after a prefill is not a number of largest tensors: it is what the
//! allocator's best fit makes of one layer's requests after another. Layer 0 makes a segment
//! for every tensor its sequence needs; later layers ask for the same sizes and get the blocks
//! the previous layer freed back, except where the KV cache's per-layer copies
//! (`DynamicLayer.update`'s `torch.cat`, which stay) were carved out of a freed block that the
//! next layer needs whole: a freed MLP block split by a copy no longer holds an MLP request, so
//! that layer's MLP takes a fresh segment (`docs/oracle.md`, "The prefill's slack: the
//! replay, in the model"). Which blocks the copies land in depends on every request before them, so this
//! module does not count: it replays the sequence of one prefill, layer after layer, through
//! the allocator's rules, and then the first decode steps' copies of the cache, one token
//! longer, which is where a cache that outgrows the prefill's free room takes new segments.
//!
//! The heap follows `c10/cuda/CUDACachingAllocator.cpp` (torch 2.11, default configuration) as
//! `tools/oracle/allocator.py` does: requests rounded to 512 B (`round_size`), the small pool
//! for blocks of at most 1 MiB (`get_pool`), best fit with ties to the lower address
//! (`get_free_block`, `BlockComparatorSize`), a new segment sized by `get_allocation_size`
//! when no free block fits, the rest of a block split off when `should_split` says so, and a
//! freed block merged with its free neighbours in the same segment (`try_merge_blocks`).
//! Segments are never released (no `empty_cache` inside `generate`).
//!
//! The request sequence is transformers 5.17's Llama code (`models/llama/modeling_llama.py`;
//! Qwen2, Mistral and `SmolLM2` run the same; Qwen3 adds `q_norm` and `k_norm`), as the oracle's
//! event log of `Qwen2.5-0.5B` and `Qwen3-0.6B` prefills shows it, tensor for tensor:
//!
//! | step | requests (`T = b·s`) | code |
//! |---|---|---|
//! | generate's inputs | the ids and the mask (`8·b·s` each), the position ids' `cumsum`, `sub`, `eq`, `masked_fill`, and the cache positions' `clone` | `GenerationMixin._sample`, `_prepare_attention_mask`, `prepare_inputs_for_generation` |
//! | embedding | `T·h·c`, held through every layer | `LlamaModel.forward` (`inputs_embeds`) |
//! | rotary tables | the fp32 positions, cuBLAS's 32 MiB workspace at the first matmul, `freqs` (`b·s·d/2·4`), `emb`, `cos`, `cos·scaling`, `sin`, `sin·scaling` (`b·s·d·4` each), and the two tables in the compute dtype (`b·s·d·c`) | `LlamaRotaryEmbedding.forward`; `CublasHandlePool.cpp` |
//! | `RMSNorm` | the fp32 copy and its `pow(2)` (`4·T·h`), the mean, `+ eps`, `rsqrt` (`4·T`), the normalised fp32 product, the cast back and the weight's product (`T·h·c`) | `LlamaRMSNorm.forward` |
//! | attention | q, k, v projections; with q/k norms each normed per head (the same `RMSNorm` sequence) before the next projection; `RoPE` on q then k (`q·cos`, `-x2` at half width, `cat`, `·sin`, the sum); the cache's key and value copies; the kernel's output and its fp32 log-sum-exp (`b·heads·s·4`, freed at once); `o_proj` | `LlamaAttention.forward`, `apply_rotary_pos_emb`, `rotate_half`, `DynamicLayer.update`, `_scaled_dot_product_cudnn_attention` |
//! | MLP | `gate_proj`, `silu` (the gate freed), `up_proj`, their product, `down_proj` | `LlamaMLP.forward` |
//! | residual | each sum `T·h·c`; the layer input freed by the caller's loop (layer 0's is `inputs_embeds`, kept) | `LlamaDecoderLayer.forward` |
//! | head | the final norm, `lm_head` on the last position (`b·V·c`) and its fp32 copy (`b·V·4`) | `LlamaForCausalLM.forward` (`logits_to_keep=1`), `_sample` |
//! | decode | every layer's sequence at one token per sequence, the cache's key and value copied one token longer (the old freed after each) | `DynamicLayer.update` (`torch.cat`) |
//!
//! Requests of a few KiB (the scalars, the boolean flags of `generate`'s stopping criteria)
//! live in the small pool's 2 MiB segments and are left out.
//!
//! Eager attention (`Decoder::eager`) replaces the kernel's output and log-sum-exp by the
//! score matrix's requests and adds the forward's causal mask ([`eager`]).
//!
//! Falcon-7B (`Decoder::layer`, [`Layer::Falcon`]) runs its own code in the same frame
//! ([`falcon`]): its weights in `FalconForCausalLM`'s order, the boolean causal mask its
//! forward always builds (kept to the forward's end) in place of `generate`'s mask flags, its
//! layer (a `LayerNorm`, the fused `query_key_value` and its k and v copies, `RoPE` as above,
//! the cache's copies, SDPA's math kernel over the mask's float conversion, `dense`, a GELU MLP
//! beside the attention) in place of Llama's, and a `LayerNorm` for the final norm; the rotary
//! tables, the head, `generate`'s inputs and the decode steps are the rows above.
//!
//! Phi-3 under eager attention ([`Layer::Phi3`], [`phi3`]) runs Llama's eager layer with one
//! fused `qkv_proj` kept to `o_proj`, a rotary ending in a `cat` (so no q copy for the scores),
//! one fused `gate_up_proj`, and a sliding window (`Decoder::window`): the mask's window
//! booleans, and a cache that keeps `window - 1` tokens, so a decode step's copies stop growing
//! at `window` tokens.

use std::sync::Mutex;

use super::allocator;
use crate::convert::f64_to_u64;

mod eager;
mod falcon;
mod phi3;
pub(super) use eager::Softmax;
#[cfg(test)]
pub(super) use eager::smollm2;

/// Bytes of the large pool's segments after `d`'s weights, its prefill and the `new - 1`
/// decode steps of `new` generated tokens (each step's fp32 logits kept into the next, as
/// `_sample` keeps them).
#[cfg(test)]
fn large_pool(d: &Decoder, new: u32) -> f64 {
    let mut run = Run::<SizeClasses>::new(d);
    run.weights();
    let mut kept = run.forward(d.s, 0.0);
    for step in 1..new {
        let next = run.forward(1.0, d.s + f64::from(step) - 1.0);
        run.heap.free(kept);
        kept = next;
    }
    let pieces = &run.heap.pieces;
    let mut gone = vec![false; pieces.len()];
    for &i in &run.heap.spare {
        gone[i] = true;
    }
    pieces
        .iter()
        .enumerate()
        .filter(|&(i, p)| !gone[i] && !p.small)
        .map(|(_, p)| p.size as f64)
        .sum()
}

/// The large pool's log of a `generate` of 2 tokens after the weights: the prefill, one decode
/// step, the logits and the cache freed at the end (as the oracle's event logs are kept).
#[cfg(test)]
fn two_token_log(d: &Decoder) -> Vec<i64> {
    let mut run = Run::<SizeClasses>::new(d);
    run.weights();
    let from = run.heap.log.len();
    let kept = run.forward(d.s, 0.0);
    let next = run.forward(1.0, d.s);
    run.heap.free(kept);
    run.heap.free(next);
    for (k, v) in run.cache.clone() {
        run.heap.free(k);
        run.heap.free(v);
    }
    let large = |x: &&i64| x.unsigned_abs() > 1_048_576;
    run.heap.log[from..].iter().filter(large).copied().collect()
}

/// An oracle event log as the tests keep it: comma-separated 512-byte blocks, allocations
/// positive and frees negative.
#[cfg(test)]
pub(super) fn oracle_log(text: &str) -> Vec<i64> {
    text.trim()
        .split(',')
        .map(|x| x.parse().expect("an integer"))
        .collect()
}

/// Asserts that a replay's log `ours` requests and frees what the oracle's log does, in order,
/// naming the first difference. The oracle's may go on past it with frees only (a run's end
/// freeing the model and its state).
#[cfg(test)]
pub(super) fn assert_same_log(oracle: &[i64], ours: &[i64]) {
    let first = oracle
        .iter()
        .zip(ours)
        .position(|(a, b)| a != b)
        .unwrap_or(oracle.len().min(ours.len()));
    assert_eq!(
        first,
        ours.len(),
        "first difference at {first}: oracle {:?}, replay {:?}",
        &oracle[first.saturating_sub(3)..(first + 5).min(oracle.len())],
        &ours[first.saturating_sub(3)..(first + 5).min(ours.len())]
    );
    assert!(
        oracle[ours.len()..].iter().all(|&x| x < 0),
        "the replay stops {} requests before the oracle's log ends",
        oracle[ours.len()..].iter().filter(|&&x| x > 0).count()
    );
}

/// Whether a `config.json` `model_type` runs the request sequence above, in transformers 5.17:
///
/// | `model_type` | modeling file | beyond `modeling_llama.py` |
/// |---|---|---|
/// | `llama` (Llama 2 and 3, `SmolLM2`, Yi, `CodeLlama`) | `models/llama/modeling_llama.py` | — |
/// | `mistral` | `models/mistral/modeling_mistral.py` | a sliding window (the replay is not chosen when it is shorter than the context) |
/// | `qwen2` | `models/qwen2/modeling_qwen2.py` | q, k and v biases: a few KiB a layer in the small pool, left out |
/// | `qwen3` | `models/qwen3/modeling_qwen3.py` | `q_norm`, `k_norm` over each head ([`Decoder::qk_norm`]) |
/// | `phi3` | `models/phi3/modeling_phi3.py` | its own layer ([`Layer::Phi3`], [`phi3`]) and sliding window, replayed only under eager attention with a kv head per head (Phi-3-mini); under SDPA (a window the replay does not follow there) it keeps the analytic slack |
/// | `falcon` | `models/falcon/modeling_falcon.py` | its own layer ([`Layer::Falcon`], [`falcon`]), replayed only for Falcon-7B's layout: one kv head (`multi_query` without `new_decoder_architecture`); Falcon-40B's and multi-head Falcons keep the analytic slack (`hf::replayed_decoder`) |
///
/// Types that share the Llama layout in [`super::ModelType`] but allocate otherwise are not
/// replayed as exact: their slack is the larger of the analytic count and this replay of the
/// Llama layout of their shape (neither is their code; the larger errs on the safe side, and the
/// analytic count alone read up to 47 % below the replay on a short prompt with a long
/// generation): `gemma` (`GemmaModel` scales the embeddings by
/// `sqrt(hidden)` into a new tensor, `GemmaRMSNorm` multiplies by `1 + weight`, a GELU gate),
/// `cohere` (`LayerNorm`, attention and MLP in parallel, logits scaled), `granite` (embedding,
/// residual and logit multipliers, each a new tensor), `internlm2` (one fused `wqkv`), `olmo`
/// (weightless `LayerNorm`, `clip_qkv`), `olmo2` (q/k norms over the whole projection, norms
/// after each sublayer), `mllama` (cross-attention layers), `deepseek_v2`/`v3` (latent
/// attention), and every type not named.
pub(super) fn follows(model_type: &str) -> bool {
    matches!(
        model_type,
        "llama" | "mistral" | "qwen2" | "qwen3" | "falcon" | "phi3"
    )
}

/// A block of the heap: a whole segment, or a piece of one split off by a request.
#[derive(Clone, Copy, Debug)]
struct Piece {
    addr: u64,
    size: u64,
    small: bool,
    free: bool,
    /// The rounded request a live block serves (the block may be larger: `should_split`).
    #[cfg(test)]
    asked: u64,
    prev: Link,
    next: Link,
}

/// A piece's neighbour in its segment, or none at the segment's end: a `u32` piece index
/// rather than an `Option<usize>` keeps a [`Piece`] in 32 bytes (40 in tests), half the 64 it
/// took, which the replay's every request reads and writes several of (issue 20: a
/// replayed `estimate` call must stay under 1 ms). A run makes a few thousand pieces at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Link(u32);

impl Link {
    const NONE: Link = Link(u32::MAX);

    fn to(i: usize) -> Link {
        Link(u32::try_from(i).expect("fewer than 2^32 pieces"))
    }

    fn get(self) -> Option<usize> {
        (self != Link::NONE).then_some(self.0 as usize)
    }
}

/// A free block's place in its pool: (size, address, piece), the order of
/// `BlockComparatorSize` (addresses are unique, so the piece never decides).
type Key = (u64, u64, usize);

/// One pool's free blocks in `BlockComparatorSize` order, as the best fit searches them.
pub(super) trait FreeBlocks: Default + Clone {
    fn insert(&mut self, key: Key);
    fn remove(&mut self, key: Key);
    /// The piece of the first block of at least `size` bytes: the smallest that holds it, the
    /// lowest address among equals.
    fn best_fit(&self, size: u64) -> Option<usize>;
    /// [`FreeBlocks::best_fit`] taken out of the pool (`key` gives a piece's key), as a
    /// request takes it; a pool that finds the block's place on the way saves the removal's
    /// own search.
    fn take(&mut self, size: u64, key: impl Fn(usize) -> Key) -> Option<usize> {
        let i = self.best_fit(size)?;
        self.remove(key(i));
        Some(i)
    }
}

/// A pool's free blocks, unordered, searched whole: the pools before [`SizeClasses`], kept as a
/// second reference for the equivalence tests (and the eager tests' heaps). One scan of packed
/// keys for the best fit cost less than keeping them sorted (a binary search's mispredicted
/// branches and a `memmove` on every insert and remove: `perf annotate` of the bench), but every
/// request scanned every free block of its pool. Each block is one `u128`, size above address,
/// so the best fit is the smallest key at or above `(size, 0)`: `BlockComparatorSize`'s order.
/// Each piece's place in the vectors is kept beside them, so inserting and removing search
/// nothing.
#[cfg(test)]
#[derive(Clone, Debug, Default)]
pub(super) struct ScannedBlocks {
    keys: Vec<u128>,
    pieces: Vec<usize>,
    /// Where each piece's key is in `keys`, indexed by piece (stale for pieces not in the pool).
    slot: Vec<usize>,
}

/// (size, address) as one number that sorts as the pair does.
fn packed(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

#[cfg(test)]
impl FreeBlocks for ScannedBlocks {
    fn insert(&mut self, (size, addr, piece): Key) {
        debug_assert!(
            self.slot
                .get(piece)
                .is_none_or(|&at| self.pieces.get(at) != Some(&piece)),
            "piece {piece} is in the pool already"
        );
        if self.slot.len() <= piece {
            self.slot.resize(piece + 1, usize::MAX);
        }
        self.slot[piece] = self.keys.len();
        self.keys.push(packed(size, addr));
        self.pieces.push(piece);
    }

    fn remove(&mut self, (size, addr, piece): Key) {
        let Some(&at) = self.slot.get(piece) else {
            debug_assert!(false, "piece {piece} was never in the pool");
            return;
        };
        if self.keys.get(at) != Some(&packed(size, addr)) || self.pieces[at] != piece {
            debug_assert!(
                false,
                "piece {piece} of {size} B at {addr} is not in the pool"
            );
            return;
        }
        self.keys.swap_remove(at);
        self.pieces.swap_remove(at);
        if let Some(&moved) = self.pieces.get(at) {
            self.slot[moved] = at;
        }
    }

    fn best_fit(&self, size: u64) -> Option<usize> {
        let floor = packed(size, 0);
        let mut best = (u128::MAX, None);
        for (&key, &piece) in self.keys.iter().zip(&self.pieces) {
            if key >= floor && key < best.0 {
                best = (key, Some(piece));
            }
        }
        best.1
    }
}

/// A pool's free blocks in size classes, eight per power of two of the size in 512 B units (as
/// a two-level segregated fit keeps them), each class its blocks' packed `(size, address)` keys
/// unordered, and a bit per class that holds any. The best fit is the smallest key at or above
/// `(size, 0)` in the request's class, else the smallest key of the first class above it that
/// holds a block: the classes are monotone in the size, so every block of a higher class is
/// larger, and the result is `BlockComparatorSize`'s order bit for bit (the tests replay
/// hundreds of shapes against the B-tree the replay began with). Why classes and not one scan
/// of the pool (the tests' `ScannedBlocks`): the weights leave a rest in most of their segments (an MLP
/// weight rounded up to 2 MiB, `kRoundLarge`; the 20 MiB segments that 1–10 MiB weights share,
/// `kLargeBuffer`), about a hundred free blocks of a few sizes in the large pool of a 28-layer
/// model, which every large request of the run scanned; in classes a request looks at the
/// blocks near its own size (issue 20: `estimate` runs this replay per call, and a call must
/// stay under 1 ms). Each piece's place in its class is kept beside it, so inserting and
/// removing search nothing. Grouping by exact size in a sorted vector measured slower than the
/// scan: its binary searches and its groups' inserts and removes cost more than they saved.
#[derive(Clone, Debug, Default)]
pub(super) struct SizeClasses {
    classes: Vec<Vec<(u128, usize)>>,
    /// A bit per class that holds a block.
    full: Vec<u64>,
    /// Where each piece's key is in its class, indexed by piece.
    slot: Vec<usize>,
}

/// The class of a block of `size` bytes: monotone in the size, so every block of a higher
/// class is larger than every block of a lower one.
fn class(size: u64) -> usize {
    let units = (size >> 9).max(1);
    let lg = units.ilog2();
    let c = if lg < 3 {
        units
    } else {
        u64::from(lg) * 8 + ((units >> (lg - 3)) & 7)
    };
    usize::try_from(c).unwrap_or(usize::MAX)
}

impl FreeBlocks for SizeClasses {
    fn insert(&mut self, (size, addr, piece): Key) {
        let c = class(size);
        if self.classes.len() <= c {
            self.classes.resize_with(c + 1, Vec::new);
            self.full.resize(c / 64 + 1, 0);
        }
        if self.slot.len() <= piece {
            self.slot.resize(piece + 1, usize::MAX);
        }
        self.slot[piece] = self.classes[c].len();
        self.classes[c].push((packed(size, addr), piece));
        self.full[c / 64] |= 1 << (c % 64);
    }

    fn remove(&mut self, (size, addr, piece): Key) {
        let c = class(size);
        let (Some(list), Some(&at)) = (self.classes.get_mut(c), self.slot.get(piece)) else {
            debug_assert!(false, "piece {piece} of {size} B is not in the pool");
            return;
        };
        if list.get(at) != Some(&(packed(size, addr), piece)) {
            debug_assert!(
                false,
                "piece {piece} of {size} B at {addr} is not in the pool"
            );
            return;
        }
        list.swap_remove(at);
        if let Some(&(_, moved)) = list.get(at) {
            self.slot[moved] = at;
        }
        if list.is_empty() {
            self.full[c / 64] &= !(1 << (c % 64));
        }
    }

    fn best_fit(&self, size: u64) -> Option<usize> {
        let (c, at) = self.find(size)?;
        Some(self.classes[c][at].1)
    }

    fn take(&mut self, size: u64, _: impl Fn(usize) -> Key) -> Option<usize> {
        let (c, at) = self.find(size)?;
        let list = &mut self.classes[c];
        let (_, piece) = list.swap_remove(at);
        if let Some(&(_, moved)) = list.get(at) {
            self.slot[moved] = at;
        }
        if list.is_empty() {
            self.full[c / 64] &= !(1 << (c % 64));
        }
        Some(piece)
    }
}

impl SizeClasses {
    /// The best fit's class and place in it: the smallest key at or above `(size, 0)` in the
    /// request's class, else the smallest of the first class above it that holds a block.
    fn find(&self, size: u64) -> Option<(usize, usize)> {
        let smallest = |list: &[(u128, usize)], floor: u128| {
            let mut best = (u128::MAX, None);
            for (at, &(key, _)) in list.iter().enumerate() {
                if key >= floor && key < best.0 {
                    best = (key, Some(at));
                }
            }
            best.1
        };
        let c = class(size);
        if let Some(at) = self
            .classes
            .get(c)
            .and_then(|list| smallest(list, packed(size, 0)))
        {
            return Some((c, at));
        }
        let mut word = c / 64;
        let mut bits = self.full.get(word)? & (u64::MAX << (c % 64) << 1);
        while bits == 0 {
            word += 1;
            bits = *self.full.get(word)?;
        }
        let next = word * 64 + bits.trailing_zeros() as usize;
        Some((next, smallest(&self.classes[next], 0)?))
    }
}

/// The caching allocator's blocks and pools on one stream.
#[derive(Clone, Debug, Default)]
pub(super) struct Heap<P: FreeBlocks = SizeClasses> {
    pieces: Vec<Piece>,
    /// Pieces merged into a neighbour (`try_merge_blocks`), whose slots new pieces reuse.
    spare: Vec<usize>,
    /// Free blocks of the large pool (`[1]`) and the small pool (`[0]`), by (size, address).
    pools: [P; 2],
    next_addr: u64,
    reserved: u64,
    allocated: u64,
    peak_allocated: u64,
    /// Every request's block size (> 0) and every free (< 0), for the tests' comparisons with
    /// the oracle's event log.
    #[cfg(test)]
    pub(super) log: Vec<i64>,
}

/// A live request: the piece it holds, or nothing for an empty tensor.
pub(super) type Handle = Option<usize>;

impl<P: FreeBlocks> Heap<P> {
    fn pool(small: bool) -> usize {
        usize::from(!small)
    }

    /// A new piece, in a merged piece's slot when there is one.
    fn add(&mut self, piece: Piece) -> usize {
        if let Some(i) = self.spare.pop() {
            self.pieces[i] = piece;
            i
        } else {
            self.pieces.push(piece);
            self.pieces.len() - 1
        }
    }

    fn insert(&mut self, i: usize) {
        let p = self.pieces[i];
        self.pools[Self::pool(p.small)].insert((p.size, p.addr, i));
    }

    fn remove(&mut self, i: usize) {
        let p = self.pieces[i];
        self.pools[Self::pool(p.small)].remove((p.size, p.addr, i));
    }

    /// A request of `bytes` (`malloc`): the smallest free block of its pool that holds it, or a
    /// new segment; the rest is split off when the allocator would.
    pub(super) fn malloc(&mut self, bytes: f64) -> Handle {
        if bytes <= 0.0 {
            return None;
        }
        let (size, seg) = allocator::block_and_segment(bytes).unwrap_or_else(|| {
            let block = allocator::block(bytes);
            (f64_to_u64(block), f64_to_u64(allocator::segment(block)))
        });
        // `allocator::small` of the block: exact in whole bytes (the block is a float's whole
        // number, and 1 MiB is far below where floats skip any).
        let small = size <= allocator::SMALL_BYTES;
        let pool = Self::pool(small);
        let pieces = &self.pieces;
        let i =
            if let Some(i) = self.pools[pool].take(size, |i| (pieces[i].size, pieces[i].addr, i)) {
                i
            } else {
                let i = self.add(Piece {
                    addr: self.next_addr,
                    size: seg,
                    small,
                    free: true,
                    #[cfg(test)]
                    asked: 0,
                    prev: Link::NONE,
                    next: Link::NONE,
                });
                // Saturating: a request past 2^64 B (absurd annotations) must not wrap or
                // panic; its estimate is refused against the GPU's size anyway.
                self.next_addr = self.next_addr.saturating_add(seg);
                self.reserved = self.reserved.saturating_add(seg);
                i
            };
        let rest = self.pieces[i].size - size;
        if allocator::splits(rest, small) {
            let p = self.pieces[i];
            let r = self.add(Piece {
                addr: p.addr.saturating_add(size),
                size: rest,
                small,
                free: true,
                #[cfg(test)]
                asked: 0,
                prev: Link::to(i),
                next: p.next,
            });
            if let Some(n) = p.next.get() {
                self.pieces[n].prev = Link::to(r);
            }
            self.pieces[i].next = Link::to(r);
            self.pieces[i].size = size;
            self.insert(r);
        }
        self.pieces[i].free = false;
        #[cfg(test)]
        {
            self.log.push(i64::try_from(size).unwrap_or(i64::MAX));
            self.pieces[i].asked = size;
        }
        self.allocated = self.allocated.saturating_add(self.pieces[i].size);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        Some(i)
    }

    /// A tensor's storage freed (`free_block`): its block merges with free neighbours of its
    /// segment.
    pub(super) fn free(&mut self, h: Handle) {
        let Some(mut i) = h else { return };
        #[cfg(test)]
        self.log
            .push(-i64::try_from(self.pieces[i].asked).unwrap_or(i64::MAX));
        self.allocated = self.allocated.saturating_sub(self.pieces[i].size);
        self.pieces[i].free = true;
        if let Some(p) = self.pieces[i].prev.get().filter(|&p| self.pieces[p].free) {
            self.remove(p);
            self.absorb_next(p);
            i = p;
        }
        if let Some(n) = self.pieces[i].next.get().filter(|&n| self.pieces[n].free) {
            self.remove(n);
            self.absorb_next(i);
        }
        self.insert(i);
    }

    /// `try_merge_blocks`: a block takes over its next neighbour's bytes.
    fn absorb_next(&mut self, i: usize) {
        let n = self.pieces[i]
            .next
            .get()
            .expect("a merged block has a next neighbour");
        let (size, next) = (self.pieces[n].size, self.pieces[n].next);
        self.pieces[i].size += size;
        self.pieces[i].next = next;
        if let Some(nn) = next.get() {
            self.pieces[nn].prev = Link::to(i);
        }
        self.spare.push(n);
    }

    /// Bytes of segments made (`max_memory_reserved` of a run that releases none).
    pub(super) fn reserved(&self) -> f64 {
        self.reserved as f64
    }

    /// Bytes in live blocks now (`memory_allocated`).
    pub(super) fn allocated(&self) -> f64 {
        self.allocated as f64
    }

    /// The peak of bytes in live blocks (`max_memory_allocated`).
    pub(super) fn peak_allocated(&self) -> f64 {
        self.peak_allocated as f64
    }
}

/// A decoder-only model's prefill as transformers' Llama code runs it with SDPA's fused kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Decoder {
    /// Sequences of the batch.
    pub b: f64,
    /// Prompt tokens of each.
    pub s: f64,
    /// Compute width in bytes, which the cache's copies share.
    pub c: f64,
    pub h: f64,
    /// `heads·head_dim`.
    pub q: f64,
    /// `kv_heads·head_dim`.
    pub kv: f64,
    pub heads: f64,
    pub head_dim: f64,
    pub ffn: f64,
    pub vocab: f64,
    pub layers: usize,
    /// Qwen3's per-head `q_norm` and `k_norm`.
    pub qk_norm: bool,
    /// The LM head is the input embedding (one tensor, not two).
    pub tied: bool,
    /// Eager attention (its softmax's road) instead of SDPA's fused kernels ([`eager`]).
    pub eager: Option<Softmax>,
    /// Whose modeling code builds the weights and runs each layer.
    pub layer: Layer,
    /// `sliding_window` of a [`Layer::Phi3`] config: its cache keeps the last `window - 1`
    /// tokens (`DynamicSlidingWindowLayer`) and its mask masks past them ([`phi3`]).
    pub window: Option<f64>,
}

/// The modeling code a [`Decoder`]'s weights and layers follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layer {
    /// `modeling_llama.py` (the table above; Qwen3's q/k norms by [`Decoder::qk_norm`]).
    Llama,
    /// `modeling_falcon.py` with one kv head, attention beside the MLP and rotary positions
    /// (Falcon-7B's layout): the boolean causal mask of every forward, the fused
    /// `query_key_value`, `LayerNorm`, SDPA's math kernel and a GELU MLP ([`falcon`]).
    Falcon,
    /// `modeling_phi3.py` under eager attention: Llama's layer with one fused `qkv_proj`, a
    /// rotary that ends in a `cat`, one fused `gate_up_proj`, and a sliding-window cache and
    /// mask ([`phi3`]).
    Phi3,
}

/// What the replay leaves.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Replayed {
    /// Reserved − the allocated peak at the end of the prefill: the slack beside its peak.
    pub prefill_slack: f64,
    /// Segments the decode steps' cache copies make beyond the prefill's.
    pub decode_fresh: f64,
    /// Cache tokens of each copy after the last decode step replayed.
    pub tokens: f64,
    /// The room the cache's copies can move in after the last step replayed: each stretch of a
    /// large-pool segment that holds only free blocks and copies (nothing else live splits it),
    /// in bytes. Copies move only inside such stretches: a freed copy merges with its free
    /// neighbours (`try_merge_blocks`), never across a live block or a segment's end.
    pub room: Vec<u64>,
}

/// cuBLAS's workspace per handle on sm90 (`CublasHandlePool.cpp`), taken from the caching
/// allocator at the first matmul and kept.
pub(super) const CUBLAS_WORKSPACE: f64 = 32.0 * 1_048_576.0;

/// Decode steps replayed at most: the copies grow one token a step, and a step that makes no
/// segment leaves the free blocks one token's worth larger for the next (see [`replay`]).
const DECODE_STEPS: usize = 8;

struct Run<'a, P: FreeBlocks = SizeClasses> {
    heap: Heap<P>,
    d: &'a Decoder,
    /// Each layer's key and value copies.
    cache: Vec<(Handle, Handle)>,
    /// cuBLAS's workspace, once taken.
    cublas: Handle,
}

impl<'a, P: FreeBlocks> Run<'a, P> {
    /// An empty heap and cache for `d`'s run.
    fn new(d: &'a Decoder) -> Self {
        Run {
            heap: Heap::default(),
            d,
            cache: vec![(None, None); d.layers],
            cublas: None,
        }
    }

    /// The weights, built on the GPU in `model.parameters()` order (each module registers
    /// its parameters as it is built), then the rotary `inv_freq` buffer (`original_inv_freq`,
    /// its copy, is a few hundred bytes in the small pool's first segment, left out). Nothing is freed, so
    /// `empty_cache()` before the run releases nothing: the segments keep the free room of their
    /// 2 MiB rounding (`kRoundLarge`) and of the 20 MiB segments that 1–10 MiB weights share
    /// (`kLargeBuffer`), which the prefill's small requests may take. Biases (Qwen2's q, k and
    /// v) are a few KiB a layer in the small pool and left out.
    fn weights(&mut self) {
        let d = *self.d;
        let c = d.c;
        let embedding = d.vocab * d.h * c;
        self.heap.malloc(embedding);
        let (layer, final_norm) = match d.layer {
            Layer::Llama => {
                let mut layer = vec![d.q * d.h, d.kv * d.h, d.kv * d.h, d.h * d.q];
                if d.qk_norm {
                    layer.extend([d.head_dim; 2]);
                }
                layer.extend([d.ffn * d.h; 3]);
                // The two `RMSNorm`s' weights.
                layer.extend([d.h; 2]);
                (layer, 1)
            }
            Layer::Falcon => (falcon::layer_parameters(&d), falcon::FINAL_NORM_PARAMETERS),
            Layer::Phi3 => (phi3::layer_parameters(&d), 1),
        };
        for _ in 0..d.layers {
            for &w in &layer {
                self.heap.malloc(w * c);
            }
        }
        for _ in 0..final_norm {
            self.heap.malloc(d.h * c);
        }
        if !d.tied {
            self.heap.malloc(embedding);
        }
        self.heap.malloc(d.head_dim / 2.0 * 4.0);
    }

    /// [`Replayed::room`]: the stretches of each large-pool segment between live blocks that are
    /// not the cache's copies.
    fn cache_room(&self) -> Vec<u64> {
        let pieces = &self.heap.pieces;
        let mut gone = vec![false; pieces.len()];
        for &i in &self.heap.spare {
            gone[i] = true;
        }
        let mut copy = vec![false; pieces.len()];
        for &(k, v) in &self.cache {
            for i in [k, v].into_iter().flatten() {
                copy[i] = true;
            }
        }
        let mut room = Vec::new();
        for head in (0..pieces.len())
            .filter(|&i| !gone[i] && !pieces[i].small && pieces[i].prev == Link::NONE)
        {
            let (mut at, mut run) = (Some(head), 0);
            while let Some(i) = at {
                if pieces[i].free || copy[i] {
                    run += pieces[i].size;
                } else if run > 0 {
                    room.push(run);
                    run = 0;
                }
                at = pieces[i].next.get();
            }
            if run > 0 {
                room.push(run);
            }
        }
        room
    }

    /// `LlamaRMSNorm.forward` over `n` rows of `w` values: returns the normalised output.
    /// `hidden_states.to(torch.float32)` and `.to(input_dtype)` return the tensor itself when it
    /// already has that dtype (`Tensor.to`), so an fp32 model makes neither copy.
    fn norm(&mut self, n: f64, w: f64) -> Handle {
        let c = self.d.c;
        let cast = c != 4.0;
        let a = if cast {
            self.heap.malloc(4.0 * n * w)
        } else {
            None
        };
        let p = self.heap.malloc(4.0 * n * w);
        let var = self.heap.malloc(4.0 * n);
        self.heap.free(p);
        let e = self.heap.malloc(4.0 * n);
        let r = self.heap.malloc(4.0 * n);
        self.heap.free(e);
        let x = self.heap.malloc(4.0 * n * w);
        self.heap.free(r);
        self.heap.free(a);
        let y = if cast {
            self.heap.malloc(c * n * w)
        } else {
            None
        };
        let out = self.heap.malloc(c * n * w);
        self.heap.free(y);
        self.heap.free(x);
        self.heap.free(var);
        out
    }

    /// `apply_rotary_pos_emb` on one of q or k, `width` values a token: returns the rotated copy.
    fn rope(&mut self, t: f64, width: f64) -> Handle {
        let c = self.d.c;
        let cos = self.heap.malloc(t * width * c);
        let neg = self.heap.malloc(t * width * c / 2.0);
        let cat = self.heap.malloc(t * width * c);
        self.heap.free(neg);
        let sin = self.heap.malloc(t * width * c);
        self.heap.free(cat);
        let sum = self.heap.malloc(t * width * c);
        self.heap.free(cos);
        self.heap.free(sin);
        sum
    }

    /// A projection, normed per head when the model has q/k norms.
    fn projection(&mut self, t: f64, width: f64) -> Handle {
        let proj = self.heap.malloc(t * width * self.d.c);
        if !self.d.qk_norm {
            return proj;
        }
        let normed = self.norm(t * width / self.d.head_dim, self.d.head_dim);
        self.heap.free(proj);
        normed
    }

    /// Keys a forward over `s` new tokens attends to with `past` seen: all of them, or under a
    /// sliding window the `window - 1` the cache keeps and the new ones
    /// (`DynamicSlidingWindowLayer.update` and `get_mask_sizes`).
    fn keys(&self, s: f64, past: f64) -> f64 {
        self.d.window.map_or(past, |w| past.min(w - 1.0)) + s
    }

    /// `DynamicLayer.update` of layer `i` with `s` new tokens after `past`: `torch.cat` into a
    /// new key, then a new value, each old one freed as the attribute is rebound. Under a
    /// sliding window (`DynamicSlidingWindowLayer.update`) both `cat`s come first and the
    /// attributes are rebound after, to views of them.
    fn cache_update(&mut self, i: usize, s: f64, past: f64) {
        let d = *self.d;
        let cached = d.b * self.keys(s, past) * d.kv * d.c;
        let (old_k, old_v) = self.cache[i];
        let new_k = self.heap.malloc(cached);
        if d.window.is_none() {
            self.heap.free(old_k);
        }
        let new_v = self.heap.malloc(cached);
        if d.window.is_some() {
            self.heap.free(old_k);
        }
        self.heap.free(old_v);
        self.cache[i] = (new_k, new_v);
    }

    /// One decoder layer over `b` sequences of `s` new tokens, the cache holding `past` tokens
    /// before it; returns the layer's output.
    fn layer(&mut self, i: usize, s: f64, past: f64) -> Handle {
        let d = *self.d;
        match d.layer {
            Layer::Falcon => return self.falcon_layer(i, s, past),
            Layer::Phi3 => return self.phi3_layer(i, s, past),
            Layer::Llama => {}
        }
        let (t, c) = (d.b * s, d.c);
        let normed = self.norm(t, d.h);
        let q = self.projection(t, d.q);
        let k = self.projection(t, d.kv);
        let v = self.heap.malloc(t * d.kv * c);
        let qe = self.rope(t, d.q);
        let ke = self.rope(t, d.kv);
        self.heap.free(q);
        self.heap.free(k);
        self.cache_update(i, s, past);
        self.heap.free(ke);
        self.heap.free(v);
        let (o, probs) = match d.eager {
            Some(softmax) => self.eager_attention(softmax, s, past),
            None => {
                let out = self.heap.malloc(t * d.q * c);
                let lse = self.heap.malloc(d.b * d.heads * s * 4.0);
                self.heap.free(lse);
                let o = self.heap.malloc(t * d.h * c);
                self.heap.free(out);
                (o, None)
            }
        };
        self.heap.free(qe);
        self.heap.free(normed);
        let sum = self.heap.malloc(t * d.h * c);
        self.heap.free(o);
        let m = self.norm(t, d.h);
        let gate = self.heap.malloc(t * d.ffn * c);
        let act = self.heap.malloc(t * d.ffn * c);
        self.heap.free(gate);
        let up = self.heap.malloc(t * d.ffn * c);
        let prod = self.heap.malloc(t * d.ffn * c);
        self.heap.free(act);
        self.heap.free(up);
        let down = self.heap.malloc(t * d.h * c);
        self.heap.free(prod);
        self.heap.free(m);
        let sum2 = self.heap.malloc(t * d.h * c);
        self.heap.free(down);
        self.heap.free(sum);
        self.heap.free(probs);
        sum2
    }

    /// One forward of `generate` over `s` new tokens a sequence with `past` cached; returns
    /// the fp32 copy of the last position's logits, which `_sample` keeps into the next step.
    fn forward(&mut self, s: f64, past: f64) -> Handle {
        let d = *self.d;
        let (t, c) = (d.b * s, d.c);
        let embeds = self.heap.malloc(t * d.h * c);
        let mask = if d.layer == Layer::Falcon {
            self.falcon_mask(s, past)
        } else {
            let mask = if d.eager.is_some() {
                self.eager_mask(s, past)
            } else {
                None
            };
            // The mask as booleans (`attention_mask.to(bool)`), checked and dropped.
            let flags = self.heap.malloc(t);
            self.heap.free(flags);
            mask
        };
        let positions = self.heap.malloc(t * 4.0);
        if self.cublas.is_none() {
            self.cublas = self.heap.malloc(CUBLAS_WORKSPACE);
        }
        let freqs = self.heap.malloc(t * d.head_dim / 2.0 * 4.0);
        let emb = self.heap.malloc(t * d.head_dim * 4.0);
        let cos = self.heap.malloc(t * d.head_dim * 4.0);
        let cos_scaled = self.heap.malloc(t * d.head_dim * 4.0);
        self.heap.free(cos);
        let sin = self.heap.malloc(t * d.head_dim * 4.0);
        let sin_scaled = self.heap.malloc(t * d.head_dim * 4.0);
        self.heap.free(sin);
        // `cos.to(dtype=x.dtype)`: the fp32 tables themselves in an fp32 model.
        let fp32 = c == 4.0;
        let (cos_c, sin_c) = if fp32 {
            (cos_scaled, sin_scaled)
        } else {
            (
                self.heap.malloc(t * d.head_dim * c),
                self.heap.malloc(t * d.head_dim * c),
            )
        };
        for h in [positions, freqs, emb] {
            self.heap.free(h);
        }
        if !fp32 {
            self.heap.free(cos_scaled);
            self.heap.free(sin_scaled);
        }
        let mut x = embeds;
        for i in 0..d.layers {
            let y = self.layer(i, s, past);
            if i > 0 {
                self.heap.free(x);
            }
            x = y;
        }
        let f = if d.layer == Layer::Falcon {
            self.layer_norm(t)
        } else {
            self.norm(t, d.h)
        };
        self.heap.free(x);
        if d.layers > 0 {
            self.heap.free(embeds);
        }
        self.heap.free(mask);
        self.heap.free(cos_c);
        self.heap.free(sin_c);
        let logits = self.heap.malloc(d.b * d.vocab * c);
        self.heap.free(f);
        let kept = self.heap.malloc(d.b * d.vocab * 4.0);
        self.heap.free(logits);
        kept
    }
}

/// Replays `d`'s prefill, then its decode steps while they make segments: a step whose copies
/// all fit leaves each layer's key and value in the holes of the last (`try_merge_blocks`
/// joins an old copy with its freed neighbour), and the next step, one token longer, finds
/// the same room. The steps stop at [`DECODE_STEPS`], and before the copies outgrow the 2 MiB
/// rounding of step 1's (`get_allocation_size`, `kRoundLarge`): the crossings after that are a
/// term of their own.
pub(super) fn replay(d: &Decoder) -> Replayed {
    static REPLAYS: Memo<Decoder, Replayed> = Mutex::new(Vec::new());
    memoized(&REPLAYS, *d, || replay_with::<SizeClasses>(d))
}

/// A replay's answers by shape ([`memoized`]).
pub(super) type Memo<K, V> = Mutex<Vec<(K, V)>>;

/// Shapes a replay's memo keeps before it starts again ([`memoized`]).
const MEMO_SHAPES: usize = 256;

/// `run()`'s answer for `key`, from `memo` when that key was run before. A replay is a pure
/// function of its shape and costs about a millisecond for a 28-layer model (`cargo bench
/// --bench estimate`), while the extender estimates every pod it indexes and a cluster's pods
/// repeat a few shapes: the answer is the same with or without the memo. Bounded: emptied when
/// it holds [`MEMO_SHAPES`] keys. A poisoned lock (a panic elsewhere while it was held) only
/// loses the memo. Keys compare by `==`, so a NaN field is never found and only re-runs.
pub(super) fn memoized<K: PartialEq, V: Clone>(
    memo: &Memo<K, V>,
    key: K,
    run: impl FnOnce() -> V,
) -> V {
    if let Ok(m) = memo.lock()
        && let Some((_, v)) = m.iter().find(|(k, _)| *k == key)
    {
        return v.clone();
    }
    let v = run();
    if let Ok(mut m) = memo.lock() {
        if m.len() >= MEMO_SHAPES {
            m.clear();
        }
        m.push((key, v.clone()));
    }
    v
}

/// [`replay`] of `d` and of the same model and batch at `s` prompt tokens: what `hf` takes the
/// larger of without a stated prompt (the whole context and one token less). The weights are
/// built before the first request of `generate` and do not depend on the prompt, so both runs
/// start from one heap after them, cloned, instead of building the weights twice: the same
/// requests in the same order on the same heap, bit for bit what two [`replay`]s return (a
/// test compares them).
pub(super) fn replay_pair(d: &Decoder, s: f64) -> (Replayed, Replayed) {
    static PAIRS: Memo<(Decoder, f64), (Replayed, Replayed)> = Mutex::new(Vec::new());
    memoized(&PAIRS, (*d, s), || replay_pair_with::<SizeClasses>(d, s))
}

fn replay_pair_with<P: FreeBlocks>(d: &Decoder, s: f64) -> (Replayed, Replayed) {
    let other = Decoder { s, ..*d };
    let mut run = Run::<P>::new(d);
    run.weights();
    let twin = Run {
        heap: run.heap.clone(),
        d: &other,
        cache: run.cache.clone(),
        cublas: run.cublas,
    };
    (after_weights(run), after_weights(twin))
}

/// [`replay`] with the pools kept by `P`: the tests replay with the B-tree the replay began with
/// and compare.
fn replay_with<P: FreeBlocks>(d: &Decoder) -> Replayed {
    let mut run = Run::<P>::new(d);
    run.weights();
    after_weights(run)
}

/// The rest of [`replay`] from a heap holding the weights.
fn after_weights<P: FreeBlocks>(mut run: Run<'_, P>) -> Replayed {
    let d = run.d;
    let t = d.b * d.s;
    // `generate`'s inputs: the ids and mask, the position ids (`cumsum`, `- 1`, `masked_fill`
    // where the mask is 0) and the cache positions' copy.
    let ids = run.heap.malloc(8.0 * t);
    let mask = run.heap.malloc(8.0 * t);
    let cumsum = run.heap.malloc(8.0 * t);
    let sub = run.heap.malloc(8.0 * t);
    run.heap.free(cumsum);
    let eq = run.heap.malloc(t);
    let positions = run.heap.malloc(8.0 * t);
    run.heap.free(eq);
    run.heap.free(sub);
    let clone = run.heap.malloc(8.0 * t);
    let mut kept = run.forward(d.s, 0.0);
    run.heap.free(clone);
    let prefill = run.heap.reserved();
    let prefill_slack = prefill - run.heap.peak_allocated();
    let bytes = |tokens: f64| allocator::segment(allocator::block(d.b * tokens * d.kv * d.c));
    let first = bytes(d.s + 1.0);
    let mut tokens = d.s;
    for step in 1..=DECODE_STEPS {
        let past = d.s + f64::from(u32::try_from(step).unwrap_or(u32::MAX)) - 1.0;
        if bytes(past + 1.0) > first {
            break;
        }
        let before = run.heap.reserved();
        let next = run.forward(1.0, past);
        run.heap.free(kept);
        kept = next;
        tokens = past + 1.0;
        if run.heap.reserved() == before {
            break;
        }
    }
    let room = run.cache_room();
    for h in [kept, positions, mask, ids] {
        run.heap.free(h);
    }
    Replayed {
        prefill_slack,
        decode_fresh: run.heap.reserved() - prefill,
        tokens,
        room,
    }
}

impl Replayed {
    /// How many copies of `block` bytes the room holds, each stretch as many whole ones as fit
    /// (`allocator::fits`).
    fn holds(&self, block: f64) -> f64 {
        self.room
            .iter()
            .map(|&r| allocator::fits(r as f64, block))
            .sum()
    }

    /// Fresh segments Falcon's decode makes for SDPA's math kernel as the cache grows from the
    /// replay's last step to `last` tokens, at batch > 1. Each layer of each step copies k and
    /// v broadcast to every head (`matmul`'s `expand(...).reshape`, `4·b·heads·S·d` bytes each,
    /// [`falcon`]'s `math_attention`) and frees the copy before the next: one block in flight,
    /// `4·heads/c` times a cache copy's size (142 in 16 bits) and growing with it. A copy of
    /// 10 MiB or more gets its own segment rounded to 2 MiB (`get_allocation_size`,
    /// `kRoundLarge`), so each 2 MiB level it reaches takes one fresh segment: the v copy takes
    /// the k copy's freed block back, since the requests between them (the scores, `+ mask`,
    /// the softmax: `4·b·heads·S` bytes, 1/64 of a copy) find blocks of their own size freed by
    /// the layer before. The segment a copy leaves stays cached (segments never merge), and no
    /// later, larger copy fits it. Below 10 MiB the copies share 20 MiB segments
    /// (`kLargeBuffer`): one is counted. Every level from the one the replay's last copy is in
    /// is counted (that copy may sit in a freed block just its size, which the next steps
    /// outgrow): the prefill's freed blocks hold some of the first levels (`get_free_block`),
    /// so the count is an upper bound (4 × 128 + 300 new tokens replayed step by step in the
    /// tests: 240 MiB counted, 144 made). The oracle's allocator (`tools/oracle/allocator.py`)
    /// fed this decode's requests after a 128-token prompt at batch 4 made 4.97 GiB of such
    /// segments by 2,048 tokens, against 0.06 for the cache's own copies; on a GPU the growth
    /// stops only when `cudaMalloc` fails and the allocator releases its cached segments. The
    /// step's other requests that grow with the cache are 1/64 of a copy or less and fit the
    /// levels the copies leave behind.
    pub(super) fn math_copies_fresh(&self, d: &Decoder, last: f64) -> f64 {
        if d.layer != Layer::Falcon || d.b <= 1.0 {
            return 0.0;
        }
        let per_token = 4.0 * d.b * d.heads * d.head_dim;
        let now = allocator::block(self.tokens * per_token);
        let end = allocator::block(last * per_token);
        if end <= now || allocator::small(end) {
            return 0.0;
        }
        let mut fresh = 0.0;
        if !allocator::rounded_alone(now) {
            fresh += allocator::segment(allocator::MIN_LARGE_ALLOC - 512.0);
        }
        if !allocator::rounded_alone(end) {
            return fresh;
        }
        // As [`Replayed::outgrown_fresh`]: the level the last copy is in, unless it is its top.
        let mut level = allocator::segment(now.max(allocator::MIN_LARGE_ALLOC));
        if level <= now {
            level += allocator::ROUND_LARGE;
        }
        let top = allocator::segment(end);
        while level <= top {
            fresh += level;
            level += allocator::ROUND_LARGE;
        }
        fresh
    }

    /// Fresh segments the cache's copies make as they grow from the replay's last step to
    /// `last` tokens (the cache at the generation's last forward), the decode steps the replay
    /// does not run (issue 20: a short stated prompt and a long generation).
    ///
    /// Every copy a layer's key or value needs lives either in the replay's room (a stretch of
    /// `R` bytes holds `floor(R / S)` copies of `S` bytes: the copies move into each other's
    /// merged holes, `try_merge_blocks`) or alone in a segment made for it (`get_allocation_size`:
    /// a copy of 10 MiB or more gets its size rounded up to 2 MiB, `kRoundLarge`; a smaller one
    /// a 20 MiB segment, `kLargeBuffer`, that others of its size share). `DynamicLayer.update`
    /// makes each new copy while the old one is live, so one layer's key and value are in flight
    /// beside the `2L` copies. A copy alone in a segment outgrows it at the next 2 MiB of size,
    /// and no later (larger) copy fits the segment it leaves, which stays reserved (segments
    /// never merge or shrink). So each 2 MiB level of the copies' size, `G`, adds
    /// `max(0, 2L + 2 − holds(G))` segments of `G` bytes: the copies the room does not hold
    /// when they reach the level's top. Below 10 MiB the levels share 20 MiB segments, which
    /// later copies of under 10 MiB fit again: the copies the room does not hold at the last of
    /// them are counted once, in 20 MiB segments. Copies of at most 1 MiB (the small pool) are
    /// left out: their 2 MiB segments hold the next layer's.
    ///
    /// The levels start at the one the replay's last copy is in: the copies still grow to that
    /// level's top, and the room (which holds the segments the replay made for them) may hold
    /// fewer of them there; only a last copy at its level's top (a multiple of 2 MiB) has
    /// nothing left to grow in it.
    pub(super) fn outgrown_fresh(&self, d: &Decoder, last: f64) -> f64 {
        let per_token = d.b * d.kv * d.c;
        let now = allocator::block(self.tokens * per_token);
        let end = allocator::block(last * per_token);
        if end <= now || allocator::small(end) {
            return 0.0;
        }
        let copies = 2.0 * d.layers as f64 + 2.0;
        let homeless = |block: f64| (copies - self.holds(block)).max(0.0);
        let mut fresh = 0.0;
        // Below `kMinLargeAlloc`: one count at the largest copy of that range.
        if !allocator::rounded_alone(now) {
            let top = end.min(allocator::MIN_LARGE_ALLOC - 512.0);
            fresh += allocator::fresh(homeless(top), top);
        }
        if allocator::rounded_alone(end) {
            // The level the replay's last copy is in (`get_allocation_size` rounds it up to
            // 2 MiB) still takes the copies' growth to its top, unless that copy is the top.
            let mut level = allocator::segment(now.max(allocator::MIN_LARGE_ALLOC));
            if level <= now {
                level += allocator::ROUND_LARGE;
            }
            let top_level = allocator::segment(end);
            while level <= top_level {
                let top = level.min(end);
                if self.holds(top) <= 0.0 {
                    // No stretch holds a copy this large, nor any later, larger one: every
                    // level from here takes all the copies, `n` levels of `level + 2 MiB·k`.
                    let n = ((top_level - level) / allocator::ROUND_LARGE).round() + 1.0;
                    fresh += copies * (n * level + allocator::ROUND_LARGE * n * (n - 1.0) / 2.0);
                    break;
                }
                fresh += homeless(top) * level;
                level += allocator::ROUND_LARGE;
            }
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1_048_576.0;

    fn decoder(
        (b, s): (f64, f64),
        (h, heads, kv_heads, head_dim): (f64, f64, f64, f64),
        ffn: f64,
        layers: usize,
        qk_norm: bool,
    ) -> Decoder {
        Decoder {
            b,
            s,
            c: 2.0,
            h,
            q: heads * head_dim,
            kv: kv_heads * head_dim,
            heads,
            head_dim,
            ffn,
            vocab: 151_936.0,
            layers,
            qk_norm,
            tied: false,
            eager: None,
            layer: Layer::Llama,
            window: None,
        }
    }

    fn qwen25_05b(b: f64, s: f64) -> Decoder {
        decoder((b, s), (896.0, 14.0, 2.0, 64.0), 4864.0, 24, false)
    }

    fn qwen3_06b(b: f64, s: f64) -> Decoder {
        decoder((b, s), (1024.0, 16.0, 8.0, 128.0), 3072.0, 28, true)
    }

    fn prefill_reserved(d: &Decoder) -> (f64, f64) {
        let mut run = Run::<SizeClasses>::new(d);
        let _ = run.forward(d.s, 0.0);
        (run.heap.reserved(), run.heap.peak_allocated())
    }

    #[test]
    fn best_fit_takes_the_smallest_free_block_that_holds_the_request() {
        let mut heap = Heap::<SizeClasses>::default();
        let big = heap.malloc(100.0 * MIB);
        let small = heap.malloc(50.0 * MIB);
        heap.free(big);
        heap.free(small);
        // A 40 MiB request goes into the 50 MiB block, not the 100 MiB one: no new segment,
        // and the 100 MiB block still holds a 90 MiB request whole.
        let a = heap.malloc(40.0 * MIB);
        let b = heap.malloc(90.0 * MIB);
        assert_eq!(heap.reserved(), 150.0 * MIB);
        assert_eq!(heap.pieces[a.unwrap()].addr, f64_to_u64(100.0 * MIB));
        assert_eq!(heap.pieces[b.unwrap()].addr, 0);
    }

    #[test]
    fn a_split_block_no_longer_holds_its_old_size() {
        let mut heap = Heap::<SizeClasses>::default();
        let mlp = heap.malloc(100.0 * MIB);
        heap.free(mlp);
        // A cache copy carved out of the freed block leaves 70 MiB: the next 100 MiB request
        // takes a new segment.
        let _copy = heap.malloc(30.0 * MIB);
        let _again = heap.malloc(100.0 * MIB);
        assert_eq!(heap.reserved(), 200.0 * MIB);
    }

    #[test]
    fn freed_neighbours_in_a_segment_merge_back_into_one_block() {
        let mut heap = Heap::<SizeClasses>::default();
        let whole = heap.malloc(100.0 * MIB);
        heap.free(whole);
        let a = heap.malloc(40.0 * MIB);
        let b = heap.malloc(40.0 * MIB);
        heap.free(a);
        heap.free(b);
        // Without `try_merge_blocks` the 100 MiB request would find 40 + 40 + 20 and take a
        // new segment.
        let _ = heap.malloc(100.0 * MIB);
        assert_eq!(heap.reserved(), 100.0 * MIB);
    }

    #[test]
    fn a_rest_of_at_most_1_mib_goes_with_the_request_and_small_blocks_have_their_own_pool() {
        let mut heap = Heap::<SizeClasses>::default();
        let x = heap.malloc(100.0 * MIB);
        heap.free(x);
        let y = heap.malloc(99.5 * MIB);
        // The 0.5 MiB rest is not split off: allocated counts the whole block.
        assert_eq!(heap.allocated, f64_to_u64(100.0 * MIB));
        // A 512 KiB request is a small-pool block: a 2 MiB segment, not the large pool's room.
        heap.free(y);
        let _ = heap.malloc(0.5 * MIB);
        assert_eq!(heap.reserved(), 102.0 * MIB);
        // A 3 MiB request no free block holds gets a 20 MiB segment (`kLargeBuffer`), which
        // the next ones share.
        let mut heap = Heap::<SizeClasses>::default();
        let _ = heap.malloc(3.0 * MIB);
        let _ = heap.malloc(3.0 * MIB);
        assert_eq!(heap.reserved(), 20.0 * MIB);
    }

    /// The oracle's event log of these prefills (`docs/oracle.md`, "The prefill's slack: the
    /// replay, in the model"), replayed through `tools/oracle/allocator.py` from an empty heap,
    /// reserves 472 MiB at a peak of 414.25 MiB allocated (Qwen2.5-0.5B bf16, 8 × 1,024) and
    /// 2,380 MiB at 2,248.5 (Qwen3-0.6B, 8 × 2,048), the quarter and half MiB being
    /// `generate`'s inputs, which the forward alone leaves out; the requests above 16 KiB match
    /// one for one.
    #[test]
    fn the_prefill_reserves_what_the_oracles_log_reserves() {
        let (r, a) = prefill_reserved(&qwen25_05b(8.0, 1024.0));
        assert_eq!((r / MIB, a / MIB), (472.0, 414.0));
        let (r, a) = prefill_reserved(&qwen3_06b(8.0, 2048.0));
        assert_eq!((r / MIB, a / MIB), (2380.0, 2248.0));
    }

    /// The pools as the replay first kept them, a `BTreeSet` ordered by (size, address): the
    /// reference the scanned pools must match.
    impl FreeBlocks for std::collections::BTreeSet<Key> {
        fn insert(&mut self, key: Key) {
            std::collections::BTreeSet::insert(self, key);
        }

        fn remove(&mut self, key: Key) {
            std::collections::BTreeSet::remove(self, &key);
        }

        fn best_fit(&self, size: u64) -> Option<usize> {
            self.range((size, 0, 0)..).next().map(|k| k.2)
        }
    }

    /// The oracle's decoders below, whose shapes the replay is run on.
    fn shapes() -> [Decoder; 7] {
        [
            qwen25_05b(1.0, 1.0),
            qwen3_06b(1.0, 1.0),
            // Qwen2.5-1.5B, Qwen2.5-7B (untied), Qwen3-1.7B, Qwen3-4B, SmolLM2-135M.
            decoder((1.0, 1.0), (1536.0, 12.0, 2.0, 128.0), 8960.0, 28, false),
            Decoder {
                vocab: 152_064.0,
                ..decoder((1.0, 1.0), (3584.0, 28.0, 4.0, 128.0), 18944.0, 28, false)
            },
            decoder((1.0, 1.0), (2048.0, 16.0, 8.0, 128.0), 6144.0, 28, true),
            decoder((1.0, 1.0), (2560.0, 32.0, 8.0, 128.0), 9728.0, 36, true),
            Decoder {
                vocab: 49_152.0,
                ..decoder((1.0, 1.0), (576.0, 9.0, 3.0, 64.0), 1536.0, 30, false)
            },
        ]
    }

    /// The size classes (and the scanned pools before them) change no result by a bit: every
    /// shape of the oracle's decoders below, at batches and prompts around powers of two and odd
    /// ones, replays to the same prefill slack, decode segments and room as the B-tree heap.
    #[test]
    fn the_memo_answers_what_the_replay_computes() {
        for s in [512.0, 1024.0, 512.0, 2048.0, 1024.0] {
            let d = qwen25_05b(2.0, s);
            assert_eq!(replay(&d), replay_with::<SizeClasses>(&d));
            assert_eq!(
                replay_pair(&d, s - 1.0),
                replay_pair_with::<SizeClasses>(&d, s - 1.0)
            );
        }
    }

    #[test]
    fn the_size_classes_replay_exactly_what_the_btree_replays() {
        let mut compared = 0;
        for shape in shapes() {
            for tied in [false, true] {
                for c in [2.0, 4.0] {
                    for b in [1.0, 3.0, 128.0] {
                        for s in [1.0, 511.0, 2048.0, 8128.0, 32_704.0] {
                            let d = Decoder {
                                b,
                                s,
                                c,
                                tied,
                                ..shape
                            };
                            same_replay(&d);
                            compared += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(compared, 7 * 2 * 2 * 3 * 5);
        // Eager attention's score blocks, each softmax road, at the batches and prompts of the
        // eager rows (SmolLM2-1.7B's shape).
        for eager in [
            eager::Softmax::Fp32,
            eager::Softmax::HalfToFloat,
            eager::Softmax::Copy,
        ] {
            for (b, s) in [(1.0, 511.0), (16.0, 2048.0), (3.0, 4096.0)] {
                same_replay(&Decoder {
                    b,
                    s,
                    eager: Some(eager),
                    ..decoder((1.0, 1.0), (2048.0, 32.0, 32.0, 64.0), 8192.0, 24, false)
                });
            }
        }
        // Falcon's and Phi-3's own layers (their sub-modules), at the rows' shapes and others:
        // the math kernel's broadcast copies at batch > 1, Phi-3's window in both directions.
        for (b, s) in [(1.0, 511.0), (4.0, 2048.0), (1.0, 8128.0), (3.0, 3000.0)] {
            same_replay(&falcon::falcon7b(b, s));
            same_replay(&Decoder {
                c: 4.0,
                ..falcon::falcon7b(b, s)
            });
        }
        for (b, s) in [(1.0, 960.0), (2.0, 4096.0), (4.0, 4096.0), (3.0, 2900.0)] {
            same_replay(&phi3::phi3_mini(b, s));
        }
    }

    /// Both replays of a pair, from one heap of weights, bit for bit what each alone returns:
    /// the shapes above at the prompts `hf` pairs (the whole context and one token less).
    #[test]
    fn a_pair_from_one_heap_of_weights_replays_what_two_replays_do() {
        for shape in shapes() {
            for b in [1.0, 3.0, 128.0] {
                for s in [2.0, 512.0, 2048.0, 8192.0] {
                    let d = Decoder { b, s, ..shape };
                    let shorter = Decoder { s: s - 1.0, ..d };
                    let (at, shorter_at) = replay_pair(&d, s - 1.0);
                    assert_eq!(bits(&at), bits(&replay(&d)), "{d:?}");
                    assert_eq!(bits(&shorter_at), bits(&replay(&shorter)), "{d:?}");
                }
            }
        }
        // Falcon's and Phi-3's weights are their own (`query_key_value`, `qkv_proj`,
        // `gate_up_proj`): the pair clones those too.
        for d in [falcon::falcon7b(4.0, 2048.0), phi3::phi3_mini(2.0, 4096.0)] {
            let shorter = Decoder { s: d.s - 1.0, ..d };
            let (at, shorter_at) = replay_pair(&d, d.s - 1.0);
            assert_eq!(bits(&at), bits(&replay(&d)), "{d:?}");
            assert_eq!(bits(&shorter_at), bits(&replay(&shorter)), "{d:?}");
        }
    }

    /// Everything [`replay`] returns, bit for bit, from the size classes, the scanned pools and
    /// the B-tree.
    fn same_replay(d: &Decoder) {
        let old = bits(&replay_with::<std::collections::BTreeSet<Key>>(d));
        assert_eq!(bits(&replay_with::<ScannedBlocks>(d)), old, "{d:?}");
        assert_eq!(bits(&replay_with::<SizeClasses>(d)), old, "{d:?}");
    }

    fn bits(r: &Replayed) -> (u64, u64, u64, Vec<u64>) {
        (
            r.prefill_slack.to_bits(),
            r.decode_fresh.to_bits(),
            r.tokens.to_bits(),
            r.room.clone(),
        )
    }

    /// Request for request: through the weights, a prefill and a decode step, the size classes
    /// and the reused slots log the same blocks in the same order as the B-tree heap, and reach
    /// the same reserved and peak.
    #[test]
    fn the_size_classes_log_the_btree_heaps_events() {
        let d = Decoder {
            tied: true,
            ..qwen3_06b(8.0, 2048.0)
        };
        let mut new = Run::<SizeClasses>::new(&d);
        let mut old = Run::<std::collections::BTreeSet<Key>>::new(&d);
        new.weights();
        old.weights();
        let _ = (new.forward(d.s, 0.0), old.forward(d.s, 0.0));
        let _ = (new.forward(1.0, d.s), old.forward(1.0, d.s));
        assert_eq!(new.heap.log, old.heap.log);
        assert_eq!(
            (new.heap.reserved, new.heap.peak_allocated),
            (old.heap.reserved, old.heap.peak_allocated)
        );
    }

    fn gib(bytes: f64) -> f64 {
        bytes / 1024.0 / MIB
    }

    /// Qwen2.5 (Llama's code with q/k/v biases): the slack of the oracle's full run (weights,
    /// `empty_cache()`, the prefill of one new token), `max_reserved − max_allocated` replayed
    /// by `tools/oracle/allocator.py`: 1.44022 GiB at fp16 32 × 1,984 (1.5B, tied head),
    /// 1.21668 at 8 × 8,128 (7B, untied), 0.07576 for 0.5B bf16 at 8 × 1,024. Within 1 MiB:
    /// the biases (a few KiB a layer) are left out. Counting two MLP blocks instead (the old
    /// rule) gives 2.12, 4.59 and 0.15 GiB.
    #[test]
    fn qwen2_prefills_strand_what_the_oracle_strands() {
        let q15 = Decoder {
            tied: true,
            ..decoder(
                (32.0, 1984.0),
                (1536.0, 12.0, 2.0, 128.0),
                8960.0,
                28,
                false,
            )
        };
        let q7 = Decoder {
            vocab: 152_064.0,
            ..decoder(
                (8.0, 8128.0),
                (3584.0, 28.0, 4.0, 128.0),
                18944.0,
                28,
                false,
            )
        };
        let q05 = Decoder {
            tied: true,
            ..qwen25_05b(8.0, 1024.0)
        };
        for (d, oracle) in [(q15, 1.44022), (q7, 1.21668), (q05, 0.07576)] {
            let slack = gib(replay(&d).prefill_slack);
            assert!(
                (slack - oracle).abs() < 1.0 / 1024.0,
                "{slack} against {oracle}"
            );
        }
    }

    /// Qwen3-0.6B bf16 at 8 × 2,048, 2 new tokens: the oracle's run reserves 3.4551 GiB after
    /// the prefill (slack 0.14903 GiB) and 3.7871 after the decode steps, +340 MiB: the cache's
    /// copies one token longer, 32 MiB each, outgrow the blocks the prefill freed.
    #[test]
    fn qwen3_decode_copies_take_what_the_oracle_takes() {
        let d = Decoder {
            tied: true,
            ..qwen3_06b(8.0, 2048.0)
        };
        let r = replay(&d);
        assert!((gib(r.prefill_slack) - 0.14903).abs() < 1.0 / 1024.0);
        assert_eq!(r.decode_fresh, 340.0 * MIB);
    }

    /// Qwen3-0.6B at 32 × 8,128 (`docs/oracle.md`, "Why the model reads low on three rows"):
    /// 17 segments of 510 MiB at decode steps 1 and 2 in the oracle's replay.
    #[test]
    fn a_cache_larger_than_the_prefills_free_room_takes_fresh_segments_in_decode() {
        let d = Decoder {
            tied: true,
            ..qwen3_06b(32.0, 8128.0)
        };
        assert_eq!(replay(&d).decode_fresh, 17.0 * 510.0 * MIB);
    }

    /// Qwen3-4B at 8 × 32,704: the cache's copies (511 MiB) carved out of the freed MLP blocks
    /// (4,854.5 MiB) send later layers' MLPs to fresh segments, nine in the oracle's replay
    /// (+42.7 GiB after layer 0). Two MLP blocks (9.5 GiB, the old rule) read it 8.8 % low.
    #[test]
    fn copies_carved_from_mlp_blocks_send_later_layers_to_fresh_segments() {
        let d = Decoder {
            tied: true,
            ..decoder(
                (8.0, 32_704.0),
                (2560.0, 32.0, 8.0, 128.0),
                9728.0,
                36,
                true,
            )
        };
        let mlp = 8.0 * 32_704.0 * 9728.0 * 2.0;
        let r = replay(&d);
        assert!(r.prefill_slack > 3.0 * mlp, "{}", gib(r.prefill_slack));
        assert_eq!(r.decode_fresh, 0.0);
    }

    /// (reserved after the prefill, after every decode step) of `new` generated tokens: the
    /// reference [`Replayed::outgrown_fresh`] stands in for (a few ms per step in a release
    /// build, so the tests that run it are ignored).
    fn every_step(d: &Decoder, new: usize) -> (f64, f64) {
        let mut run = Run::<SizeClasses>::new(d);
        run.weights();
        let mut kept = run.forward(d.s, 0.0);
        let prefill = run.heap.reserved();
        for step in 1..new {
            let next = run.forward(1.0, d.s + step as f64 - 1.0);
            run.heap.free(kept);
            kept = next;
        }
        (prefill, run.heap.reserved())
    }

    fn llama8b(b: f64, s: f64) -> Decoder {
        Decoder {
            vocab: 128_256.0,
            ..decoder((b, s), (4096.0, 32.0, 8.0, 128.0), 14336.0, 32, false)
        }
    }

    /// The grid the outgrowth term was checked on (`cargo test --release -p peakfit-core
    /// every_decode_step -- --ignored --nocapture`, 2026-11-27): decode growth replayed step by
    /// step, against the replay's step 1 plus [`Replayed::outgrown_fresh`], GiB.
    ///
    /// | shape | b × prompt + new | every step | term |
    /// |---|---|---:|---:|
    /// | Llama-3.1-8B | 4 × 2,048 + 6,144 | 19.293 | 18.115 |
    /// | Llama-3.1-8B | 1 × 1,024 + 7,168 | 1.727 | 3.428 |
    /// | Llama-3.1-8B | 8 × 1,024 + 3,072 | 18.619 | 18.115 |
    /// | Llama-3.1-8B | 16 × 512 + 1,536 | 20.268 | 18.344 |
    /// | Qwen3-0.6B | 4 × 2,048 + 6,144 | 38.127 | 38.066 |
    /// | Qwen2.5-7B | 8 × 1,024 + 3,072 | 0.549 | 0.121 |
    ///
    /// The term packs each stretch of room perfectly (`floor(R / S)` copies), which the best
    /// fit does not quite reach: up to 10 % (1.9 GiB) of the growth is left to the estimate's
    /// other side, the cache counted at the whole context while the replay's prefill holds the
    /// prompt's (3 GiB more on the Llama rows; `hf`'s
    /// `a_short_prompt_and_a_long_generation_reserve_what_every_decode_step_makes`).
    #[test]
    #[ignore = "replays thousands of decode steps: minutes in a debug build"]
    fn every_decode_step_of_a_long_generation() {
        let gib = |x: f64| x / 1024.0 / MIB;
        let (prefill, end) = every_step(&llama8b(4.0, 2048.0), 6144);
        assert_eq!(
            (
                (gib(prefill) * 1e3).round(),
                (gib(end - prefill) * 1e3).round()
            ),
            (17_428.0, 19_293.0)
        );
        for (d, new) in [
            (llama8b(1.0, 1024.0), 7168),
            (llama8b(8.0, 1024.0), 3072),
            (llama8b(16.0, 512.0), 1536),
        ] {
            let (p, e) = every_step(&d, new);
            let r = replay(&d);
            let term = r.decode_fresh + r.outgrown_fresh(&d, d.s + new as f64 - 1.0);
            println!(
                "{d:?} +{new}: every step {:.3} GiB, term {:.3}",
                gib(e - p),
                gib(term)
            );
        }
    }

    /// Falcon-7B at batch 4 after a 128-token prompt: every decode step's math-kernel copies of
    /// k and v broadcast to 71 heads grow past the prefill's freed blocks, and each 2 MiB level
    /// they reach takes a segment the heap replayed step by step makes too. Without
    /// [`Replayed::math_copies_fresh`] the replay and the cache's own growth count 0 of it.
    #[test]
    fn falcons_broadcast_copies_take_a_segment_at_each_level_they_reach() {
        let d = falcon::falcon7b(4.0, 128.0);
        let new: u16 = 300;
        let (prefill, end) = every_step(&d, usize::from(new));
        let r = replay(&d);
        let last = d.s + f64::from(new) - 1.0;
        let cache = r.decode_fresh + r.outgrown_fresh(&d, last);
        let math = r.math_copies_fresh(&d, last);
        let grown = end - prefill;
        assert!(grown > 20.0 * MIB, "{grown}");
        assert!(cache < 0.1 * grown, "{cache} of {grown}");
        // Never below what every step makes: one 20 MiB segment below 10 MiB and every level
        // from 10 to 30 MiB, where the heap finds the first few in the prefill's freed blocks.
        assert!(cache + math >= grown, "{} < {grown}", cache + math);
        assert_eq!((math / MIB, grown / MIB), (240.0, 144.0));
        // A replay whose last copy is past 10 MiB: 8 × 256 (35.5 MiB), 150 tokens on.
        let d = falcon::falcon7b(8.0, 256.0);
        let (prefill, end) = every_step(&d, 150);
        let r = replay(&d);
        let last = d.s + 149.0;
        let counted = r.decode_fresh + r.outgrown_fresh(&d, last) + r.math_copies_fresh(&d, last);
        assert!(counted >= end - prefill, "{counted} < {}", end - prefill);
        // At batch 1 `matmul` folds the broadcast into a view: nothing to count.
        assert_eq!(
            r.math_copies_fresh(&falcon::falcon7b(1.0, 128.0), last),
            0.0
        );
    }

    /// The copies of Llama-3.1-8B at 4 × 2,048 fit the prefill's room at step 1, and the room
    /// holds fewer of them as they grow to 64 MiB: the term counts the segments they outgrow
    /// into, none past the replay's own step, and more the longer the generation.
    #[test]
    fn copies_that_outgrow_the_prefills_room_take_segments_at_each_level() {
        let d = llama8b(4.0, 2048.0);
        let r = replay(&d);
        assert_eq!(r.decode_fresh, 0.0);
        assert_eq!(r.outgrown_fresh(&d, r.tokens), 0.0);
        let half = r.outgrown_fresh(&d, 2048.0 + 3071.0);
        let whole = r.outgrown_fresh(&d, 2048.0 + 6143.0);
        assert!(half > 0.0 && whole > half, "{half} {whole}");
        // 18.115 GiB, beside the 19.293 of the step-by-step replay (above).
        assert_eq!((whole / MIB).round(), 18_550.0);
    }

    /// A last replayed copy past 10 MiB but short of its 2 MiB level still grows in that level:
    /// one layer of 1,024 kv heads (256 KiB a token) at 40 prompt tokens stops its replay at 41
    /// (10.25 MiB, a 12 MiB segment: `get_allocation_size`, `kRoundLarge`), and the heap run
    /// through every step to 48 tokens (12 MiB) makes a 12 MiB segment there, which a term
    /// starting at the next level (14 MiB) left out.
    #[test]
    fn the_level_the_replays_last_copy_is_in_counts_its_growth() {
        let d = Decoder {
            vocab: 1000.0,
            ..decoder(
                (1.0, 40.0),
                (1024.0, 1024.0, 1024.0, 128.0),
                4096.0,
                1,
                false,
            )
        };
        let r = replay(&d);
        assert_eq!(r.tokens, 41.0);
        let (prefill, end) = every_step(&d, 9);
        assert_eq!((end - prefill) / MIB, 12.0);
        let term = r.decode_fresh + r.outgrown_fresh(&d, 48.0);
        assert!(term >= end - prefill, "{}", term / MIB);
        // One segment of the level's size per copy the room does not hold at its top.
        assert_eq!(term / MIB, 24.0);
    }

    /// `Tensor.to(dtype)` returns the tensor itself when the dtype is already right: an fp32
    /// `LlamaRMSNorm` makes `pow`, the mean, `+ eps`, `rsqrt`, the normalised product and the
    /// weight's product, six requests; bf16 adds the fp32 copy and the cast back.
    #[test]
    fn fp32_norms_and_rotary_tables_make_no_cast_copies() {
        for (c, requests) in [(4.0, 6), (2.0, 8)] {
            let d = Decoder {
                c,
                ..qwen3_06b(1.0, 16.0)
            };
            let mut run = Run::<SizeClasses>::new(&d);
            let _ = run.norm(16.0, d.h);
            assert_eq!(run.heap.log.iter().filter(|&&x| x > 0).count(), requests);
        }
        // The rotary tables: `cos.to(x.dtype)` is `cos` in fp32.
        let count = |c: f64| {
            let d = Decoder {
                c,
                layers: 0,
                ..qwen3_06b(1.0, 16.0)
            };
            let mut run = Run::<SizeClasses>::new(&d);
            let _ = run.forward(16.0, 0.0);
            run.heap.log.iter().filter(|&&x| x > 0).count()
        };
        // Two tables, and the final norm's two casts.
        assert_eq!(count(2.0) - count(4.0), 2 + 2);
    }

    /// Once the room holds no copy, every later level takes all `2L + 2`: summed in one step,
    /// the same bytes as the level-by-level sum.
    #[test]
    fn levels_past_the_rooms_reach_are_summed_whole() {
        let d = Decoder {
            b: 1.0,
            kv: MIB / 2.0,
            c: 1.0,
            layers: 1,
            ..qwen3_06b(1.0, 1.0)
        };
        // One token is 0.5 MiB a copy: 24 tokens, 12 MiB; a 100 MiB stretch of room.
        let r = Replayed {
            prefill_slack: 0.0,
            decode_fresh: 0.0,
            tokens: 24.0,
            room: vec![f64_to_u64(100.0 * MIB)],
        };
        let last = 400.0;
        let mut naive = 0.0;
        let mut level = 14.0 * MIB;
        while level <= 200.0 * MIB {
            let held = (100.0 * MIB / level).floor();
            naive += (4.0 - held).max(0.0) * level;
            level += 2.0 * MIB;
        }
        assert_eq!(r.outgrown_fresh(&d, last), naive);
    }
}
