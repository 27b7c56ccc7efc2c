//! An encoder-decoder's `generate` (Whisper's): its activations at the allocated peak and the
//! reserved memory of its three phases.

use super::block::Block;
use super::forward::{forward_peak, generate_logits, stranding_tensor};
use crate::model::estimate::{HF_SLACK_INFERENCE_TENSORS, Inputs, allocator};

/// An encoder-decoder's activations at its allocated peak: the encoder's forward before any
/// cache exists, or the first decoder call, which holds the encoder's output while one layer's
/// cross-attention key and value are projected and copied into the cache (`WhisperAttention`:
/// `k_proj`, then `transpose(1, 2).contiguous()`, then the cache's `torch.cat`).
pub(super) fn seq2seq_activations(inp: &Inputs, block: &Block, positions: f64, kv: f64) -> f64 {
    // The encoder runs once per input; `_expand_inputs_for_generation` then repeats its output
    // per beam, and the decoder's projections read the repeated one.
    let t_enc = inp.batch * inp.beams * positions;
    let encoder = forward_peak(block, &inp.pass(inp.batch, positions));
    let c = inp.compute_bytes();
    let first_step = t_enc * block.h * c + 2.0 * t_enc * block.kv * c;
    (encoder - kv).max(first_step)
}

/// Whisper's reserved memory beyond its allocated peak. `generate` runs three phases, and the
/// caching allocator serves each from the blocks the one before it freed
/// (`CUDACachingAllocator.cpp` `get_free_block`), so reserved is the largest of them, not the
/// allocated peak plus the encoder's stranded blocks:
///
/// 1. the encoder's forward (`WhisperEncoder.forward`), no cache yet: its activations and
///    `HF_SLACK_INFERENCE_TENSORS` stranded blocks of its largest tensor, as any forward;
/// 2. the first decoder call, which projects the encoder's output into every decoder layer's
///    cross-attention key and value (`WhisperAttention.forward`: `k_proj`, `v_proj`,
///    `transpose(1, 2).contiguous()`, `EncoderDecoderCache.cross_attention_cache.update`). These
///    `2·L` copies of `seqs·positions·kv` take the encoder's freed blocks first (every encoder
///    tensor is `positions` long, and one hidden wide or a multiple of it, so its blocks hold
///    whole copies) and fresh segments after: each copy costs at most its segment
///    (`get_allocation_size`: rounded to 2 MiB, or a share of a 20 MiB one under 10 MiB), and the
///    three more blocks of a copy's size are free after it: two from the call itself (per
///    layer `k_proj`'s output, the key's contiguous copy, `v_proj`'s output and the value's
///    contiguous copy, `v_proj`'s output freed before `DynamicLayer.update`'s `torch.cat`
///    reuses it, so the cache plus two: the layer's contiguous key and value, alive through
///    the update, then freed), and a third this model does not trace (an encoder block of the
///    same size, `seqs·positions·h·c`, is the likely one); three match the replay of
///    whisper-small b32 × 64 to the MiB (the test below);
/// 3. the decode: every step re-concatenates each layer's self-attention key and value one token
///    longer (`DynamicLayer.update`, `torch.cat`) while the old copy lives, and the freed copies
///    are one token short of the next, so the self-attention cache's blocks hold it twice; once
///    a copy is 10 MiB or more, the segments its 2 MiB crossings strand ([`seq2seq_crossings`]).
///    Beam search repeats the encoder's output per beam (`_expand_inputs_for_generation`) and
///    re-selects each cross-attention copy every step (`EncoderDecoderCache.reorder_cache`).
///
/// Taken for any encoder-decoder whose encoder output length is known (`encoder-positions`):
/// BART, T5 and `Speech2Text` run the same `generate` with an `EncoderDecoderCache`; only
/// Whisper's rows check it (`docs/oracle.md`, "Whisper's long decodes").
///
/// The oracle's replay of the H100 rows (`docs/oracle.md`, "Whisper's reserved"): whisper-small
/// at batch 64 reserved 2,432 MiB past the weights in the encoder, 1,566 MiB more in the first
/// decoder call (11 segments of 142 MiB; its 24 copies of 140.6 MiB went there and into the
/// encoder's freed blocks) and 24 MiB in the decode; the old count, two encoder MLP blocks on
/// top of the allocated peak, read it +25.7 %. The decode's relocation on whisper-large-v3
/// strands somewhat more than the one copy counted (2.35 `S` in all at batch 16, not 2).
pub(super) fn seq2seq_slack(inp: &Inputs, block: &Block, positions: f64) -> f64 {
    let seqs = inp.batch * inp.beams;
    let c = inp.compute_bytes();
    let pass = inp.pass(inp.batch, positions);
    let kv = inp.kv_cache(inp.tokens());
    let logits = generate_logits(block, seqs, c);
    let allocated = seq2seq_activations(inp, block, positions, kv) + kv + logits;
    let copies = 2.0 * (block.layers / 2.0).max(1.0);
    // The cross-attention copies are `k_proj`/`v_proj` outputs, in the compute dtype whatever
    // the self-attention cache's dtype; `kv` counts them at `kv_bytes`, so the cross copies'
    // part of it is taken out at that width.
    let copy = seqs * positions * block.kv * c;
    let self_cache = (kv - copies * seqs * positions * block.kv * inp.kv_bytes).max(0.0);
    // `_expand_inputs_for_generation` repeats `encoder_outputs` once per beam.
    let output = seqs * positions * block.h * c;
    let cross = output + allocator::fresh(copies, allocator::block(copy)) + logits;
    let in_flight = allocator::fresh(3.0, allocator::block(copy));
    // Beam search's `EncoderDecoderCache.reorder_cache` re-selects every layer's
    // cross-attention key and value each step (`index_select`): one copy more in flight.
    let reorder = if inp.beams > 1.0 {
        allocator::block(copy)
    } else {
        0.0
    };
    let per_token = seqs * block.kv * inp.kv_bytes;
    let tokens = self_cache / (copies * per_token).max(1.0);
    let room = allocator::segment(allocator::block(copy));
    let crossings = seq2seq_crossings(copies, per_token, tokens, room);
    let phases = [
        forward_peak(block, &pass) + HF_SLACK_INFERENCE_TENSORS * stranding_tensor(block, &pass),
        cross + in_flight,
        cross + reorder + 2.0 * self_cache,
        cross + reorder + in_flight + crossings,
    ];
    (phases.into_iter().fold(0.0, f64::max) - allocated).max(0.0)
}

/// The segments Whisper's decode makes for its self-attention cache once a layer's key or
/// value is at least 10 MiB: every step `DynamicLayer.update` re-concatenates each of the
/// `copies` one token (`per_token` = `seqs·kv·c`) longer (`torch.cat`) while the old one lives,
/// and every `2 MiB / per_token` steps the copies outgrow the segments made for the previous
/// size (`get_allocation_size` rounds a block of 10 MiB or more up to 2 MiB), which no later,
/// larger copy fits: they are stranded ([`cache_crossings_fresh`]'s mechanism for decoders).
///
/// The only large free blocks beside them are the three the first decoder call leaves, each
/// a segment of `room` bytes (`seq2seq_slack`). At a crossing to size `X` each holds
/// `floor(room / X)` copies less the one its old copies need beside the new ones while
/// `torch.cat` runs; the other copies take segments of `X`, and one layer's key and value in
/// flight take two more. The decode runs to `tokens` (the cache's length at the last step).
///
/// The oracle's replay (`docs/oracle.md`, "Whisper's long decodes"): whisper-small fp16 at batch
/// 64 × 448 reserved 10,736 MiB where the count without the crossings read 6,077.
///
/// [`cache_crossings_fresh`]: super::inference_slack
fn seq2seq_crossings(copies: f64, per_token: f64, tokens: f64, room: f64) -> f64 {
    let last = allocator::block((tokens - 1.0).max(0.0) * per_token);
    if !allocator::rounded_alone(last) {
        return 0.0;
    }
    // The first copy of 10 MiB or more (`kMinLargeAlloc`).
    let first = allocator::segment(allocator::block(
        (allocator::MIN_LARGE_ALLOC / per_token).ceil() * per_token,
    ));
    let mut total = 0.0;
    let mut size = first;
    while size <= allocator::segment(last) {
        let slots = 3.0 * (allocator::fits(room, size) - 1.0).max(0.0);
        total += (2.0 + (copies - slots).max(0.0)) * size;
        size += allocator::ROUND_LARGE;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An encoder-decoder's allocator slack is its largest phase (bytes past the weights and
    /// the workspace) less the tensors at its allocated peak.
    fn assert_slack_is_phase(e: &crate::model::estimate::Estimate, phase: f64) {
        use crate::model::estimate::testing::part;
        let allocated = part(e, "activations") + part(e, "kv-cache") + part(e, "logits");
        let slack = part(e, "allocator-slack");
        assert!(
            (slack - (phase - allocated)).abs() < 4.0,
            "{slack} {phase} {allocated}"
        );
    }

    /// Whisper's reserved is its largest phase, not the allocated peak plus two of the
    /// encoder's MLP blocks: the decoder's cross-attention copies are carved out of the blocks
    /// the encoder freed or take segments rounded to 2 MiB, and the decode's self-attention
    /// relocation holds that cache twice.
    #[test]
    fn whisper_reserves_its_largest_phase_not_the_encoders_blocks_on_top() {
        use crate::model::estimate::testing::est;
        let mib = 1_048_576.0;
        let large_v3 = |batch: &'static str| {
            est(&[
                ("model", "whisper-large-v3"),
                ("workload", "inference"),
                ("dtype", "fp16"),
                ("batch", batch),
            ])
        };
        let e = large_v3("16");
        // 32 decoder layers, 20 heads of 64, 16 sequences of 1,500 frames: 58.59 MiB copies in
        // 60 MiB segments; the preset's self-attention cache over `n_text_ctx` (448 tokens),
        // 40 KiB a token per copy: 10 MiB at 256 tokens, 17.46 MiB at 447, so the decode
        // crosses 10, 12, … 18 MiB, the three 60 MiB blocks in flight holding 15, 12, 9, 6, 6
        // of the 64 copies.
        let copy = 16.0 * 1500.0 * 1280.0 * 2.0;
        let self_cache = 64.0 * 16.0 * 448.0 * 1280.0 * 2.0;
        let logits = 16.0 * 51_865.0 * 6.0;
        let crossings = 51.0 * 10.0 + 54.0 * 12.0 + 57.0 * 14.0 + 60.0 * 16.0 + 60.0 * 18.0;
        let decode = copy + (64.0 + 3.0) * 60.0 * mib + crossings * mib + logits;
        assert_slack_is_phase(&e, decode);
        // At batch 1 a copy is 3.66 MiB, under `kMinLargeAlloc`: five share a 20 MiB segment,
        // so the 64 copies reserve 13 segments.
        let one = large_v3("1");
        let copy = 1500.0 * 1280.0 * 2.0;
        let decode = copy + 13.0 * 20.0 * mib + 2.0 * self_cache / 16.0 + 51_865.0 * 6.0;
        assert_slack_is_phase(&one, decode);
    }

    /// whisper-small's shape (with the MLP width given) at fp16, batch 32 × 64 tokens, and the
    /// first decoder call's reserved: the encoder's output, the 24 cross-attention copies and three
    /// more blocks, each in a 72 MiB segment, and the logits.
    fn whisper_small_b32_x64(intermediate: &str) -> (crate::model::estimate::Estimate, f64) {
        let mib = 1_048_576.0;
        let e = crate::model::estimate::testing::est(&[
            ("architecture", "encoder-decoder"),
            ("encoder-positions", "1500"),
            ("params", "241734912"),
            ("layers", "24"),
            ("hidden-size", "768"),
            ("attention-heads", "12"),
            ("kv-heads", "12"),
            ("head-dim", "64"),
            ("intermediate-size", intermediate),
            ("vocab-size", "51865"),
            ("workload", "inference"),
            ("dtype", "fp16"),
            ("batch", "32"),
            ("context-tokens", "64"),
        ]);
        let copy = 32.0 * 1500.0 * 768.0 * 2.0;
        let logits = 32.0 * 51_865.0 * 6.0;
        (e, copy + (24.0 + 3.0) * 72.0 * mib + logits)
    }

    /// A short decode leaves the first decoder call the largest phase: the 24 cross-attention
    /// copies of whisper-small at batch 32 (70.3 MiB, each in a 72 MiB segment) and three free
    /// blocks of a copy's size (two from the call, `WhisperAttention.forward`'s contiguous key
    /// and value alive through `DynamicLayer.update`; a third not traced, see
    /// [`seq2seq_slack`]). The oracle's replay of this case reserves 260 MiB past what is
    /// allocated after that call; two would count 185.
    #[test]
    fn whispers_first_decoder_call_holds_three_projections_in_flight() {
        let (e, first) = whisper_small_b32_x64("3072");
        assert_slack_is_phase(&e, first);
    }

    /// whisper-small fp16 at batch 64 × 448: a copy grows 96 KiB a token (64 × 768 × 2 B), so
    /// from 10 MiB (107 tokens, a 12 MiB segment) to 42 MiB at 447 tokens it crosses 16 sizes.
    /// The first decoder call's three 142 MiB blocks hold `3·(floor(142 / X) − 1)` copies of
    /// `X`, all 24 up to 14 MiB; past that the rest take segments of their own. The oracle's
    /// replay reserved 10,736 MiB; without the crossings the model read 6,077.
    #[test]
    fn whispers_long_decode_strands_a_segment_per_copy_at_each_crossing() {
        let mib = 1_048_576.0;
        let per_token = 64.0 * 768.0 * 2.0;
        let total = seq2seq_crossings(24.0, per_token, 448.0, 142.0 * mib);
        let expected: f64 = (6..=21)
            .map(|k| {
                let size = 2.0 * f64::from(k);
                let slots = 3.0 * ((142.0 / size).floor() - 1.0);
                (2.0 + (24.0 - slots).max(0.0)) * size
            })
            .sum();
        assert_eq!(total / mib, expected);
        assert_eq!(expected, 6522.0);
        // Under 10 MiB (large-v3 at batch 4: 4.4 MiB at 448 tokens) nothing is rounded alone.
        assert_eq!(
            seq2seq_crossings(64.0, 4.0 * 1280.0 * 2.0, 448.0, 20.0 * mib),
            0.0
        );
    }

    /// Beam search repeats the encoder's output per beam (`_expand_inputs_for_generation`) and
    /// `reorder_cache` re-selects a cross-attention copy in flight each decode step: five beams
    /// of one input reserve what five inputs do, and one copy more.
    #[test]
    fn whisper_beams_repeat_the_encoder_output_and_reorder_a_copy() {
        use crate::model::estimate::testing::{est, part};
        let run = |batch: &'static str, beams: &'static str| {
            let e = est(&[
                ("model", "whisper-large-v3"),
                ("workload", "inference"),
                ("dtype", "fp16"),
                ("batch", batch),
                ("beams", beams),
            ]);
            part(&e, "allocator-slack") + part(&e, "activations")
        };
        let copy = 5.0 * 1500.0 * 1280.0 * 2.0;
        let beams = run("1", "5");
        let inputs = run("5", "1");
        assert!(
            (beams - inputs - allocator::block(copy)).abs() < 4.0,
            "{beams} {inputs}"
        );
    }

    /// The encoder's phase wins where its MLP is wide: whisper-small's shape at batch 32 × 64
    /// with an 8× MLP (24,576), whose `fc1` output is 32 × 1,500 × 24,576 × 2 B = 2,250 MiB a
    /// block; the encoder's forward strands `HF_SLACK_INFERENCE_TENSORS` of them, more than the
    /// first decoder call's 27 blocks of 72 MiB. Without phase 1 the slack would be that call's.
    #[test]
    fn whispers_encoder_phase_wins_with_a_wide_mlp() {
        use crate::model::estimate::testing::part;
        let (e, first) = whisper_small_b32_x64("24576");
        let allocated = part(&e, "activations") + part(&e, "kv-cache") + part(&e, "logits");
        let fc1 = 32.0 * 1500.0 * 24_576.0 * 2.0;
        let slack = part(&e, "allocator-slack");
        assert!(
            slack > first - allocated + fc1,
            "{slack} {first} {allocated}"
        );
    }
}
