//! The tensors at the allocated peak of a pod that HF's modules run, from the forward, training
//! and encoder-decoder terms.

use super::forward::{decode_step, forward_peak, generate_logits};
use super::seq2seq::seq2seq_activations;
use super::training::{Saved, backward_transient, loss_forward_end, loss_peak};
use crate::model::estimate::{Checkpointing, Inputs, Kind};

/// The tensors at the peak of a pod that transformers' own modules run ([`hf`]).
///
/// Inference: the largest of the prefill (or an encoder's forward) and a decode step, over the
/// weights and the KV cache of the whole context. Encoder-decoders (Whisper): the encoder's
/// forward before any cache exists, or the first decoder step, which projects the encoder's
/// output into every layer's cross-attention cache.
///
/// Training: the largest of four moments of a step (gradients are freed by `zero_grad`, which
/// sets them to `None`, so they do not exist when backward starts):
/// 0. the forward ends, inside `torch.autocast`: every saved activation, every 16-bit weight
///    copy autocast's cache holds and the loss's forward tensors (`(c+8)·T·V`);
/// 1. backward starts: every saved activation (or each checkpointed layer's input), autocast's
///    16-bit weight copies still saved and the loss's three fp32 `T·V` tensors;
/// 2. backward ends: every gradient, one layer recomputed (or still saved) and its gradients;
/// 3. the optimizer step: every gradient and the step's temporary (`foreach` AdamW's
///    `_foreach_sqrt` of the second moment; none for the fused kernel or SGD).
pub(in crate::model::estimate) fn components(
    inp: &Inputs,
    tensor: &mut impl FnMut(&'static str, f64),
) {
    let block = inp.block();
    if !inp.workload.is_training() {
        let seqs = inp.batch * inp.beams;
        let kv = inp.kv_cache(inp.tokens());
        let activations = match inp.kind {
            Kind::EncoderDecoder {
                encoder_positions, ..
            } => {
                let positions = if encoder_positions > 0 {
                    f64::from(encoder_positions)
                } else {
                    inp.context
                };
                seq2seq_activations(inp, &block, positions, kv)
            }
            Kind::Encoder => forward_peak(&block, &inp.pass(inp.batch, inp.context)),
            // The prefill runs over the prompt; the decode steps attend over the whole context.
            _ => forward_peak(&block, &inp.pass(seqs, inp.prompt)).max(decode_step(
                &block,
                &inp.pass(seqs, inp.context),
                inp.kv_bytes,
            )),
        };
        tensor("activations", activations);
        tensor("logits", generate_logits(&block, seqs, inp.compute_bytes()));
        tensor("kv-cache", kv);
        return;
    }
    let (grads, _, _) = inp.trainable_state();
    let prec = inp.precision();
    let pass = inp.pass(inp.batch, inp.context);
    let Saved { layer, kept, head } = inp.saved(&block, &pass);
    let checkpointed = inp.checkpointing == Checkpointing::Full;
    let cast = inp.autocast_weight_copies(checkpointed);
    // A window's boolean `b·s²` mask is built once per forward (`masking_utils.sdpa_mask`)
    // and every layer's attention, recomputed ones too, reads it until backward is done.
    let mask = if pass.sdpa && block.windowed(pass.s) {
        pass.b * pass.s * pass.s
    } else {
        0.0
    };
    let start = kept + head + cast + mask + loss_peak(&block, inp.tokens(), prec);
    // The end of the forward, inside autocast's region: every cached weight copy beside the
    // loss's forward tensors (checkpointed full fine-tuning under autocast is where this beats
    // `start`: the layers' copies outweigh the loss's gradients).
    let cached = inp.autocast_copies_at_forward_end(checkpointed);
    let loss_forward = loss_forward_end(&block, inp.tokens(), prec);
    let forward_end = kept + head + cached + mask + loss_forward;
    // Backward's late moments: with checkpointing, the top layer recomputed while every
    // layer's input is still kept, or the bottom one once every gradient exists; without it,
    // the bottom layer's backward beside every gradient.
    let late = if checkpointed { kept.max(grads) } else { grads };
    let end = late + mask + layer + backward_transient(&block, &pass, prec);
    let step = grads + inp.optimizer_step_temporary();
    if forward_end > start && forward_end >= end.max(step) {
        tensor("activations", kept + head + mask);
        tensor("autocast-weights", cached);
        tensor("logits", loss_forward);
    } else if start >= end.max(step) {
        tensor("activations", kept + head + mask);
        tensor("autocast-weights", cast);
        tensor("logits", loss_peak(&block, inp.tokens(), prec));
    } else if end >= step {
        tensor("gradients", grads.min(end));
        tensor("activations", end - grads.min(end));
    } else {
        tensor("gradients", grads);
        tensor("optimizer-step", step - grads);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prefill_runs_over_the_prompt_when_it_is_annotated() {
        use crate::model::estimate::testing::{est_with, part};
        let base = [
            ("model", "llama-3.1-8b"),
            ("engine", "hf"),
            ("workload", "inference"),
            ("dtype", "bf16"),
            ("batch", "64"),
        ];
        let whole = est_with(&base, &[("context-tokens", "4096")]);
        let prompt = est_with(
            &base,
            &[("context-tokens", "4096"), ("prompt-tokens", "2048")],
        );
        let short = est_with(&base, &[("context-tokens", "2048")]);
        // The prefill's activations are the prompt's; the cache still holds the whole context.
        assert_eq!(part(&prompt, "activations"), part(&short, "activations"));
        assert!(part(&prompt, "activations") < part(&whole, "activations"));
        assert_eq!(part(&prompt, "kv-cache"), part(&whole, "kv-cache"));
    }

    /// SmolLM2-1.7B's shape, fully fine-tuned under autocast with SGD and checkpointing: the
    /// oracle's peak (21.471 GiB, as the H100 measured) is in the forward, at `cross_entropy`,
    /// where autocast's cache still holds a bf16 copy of every linear weight (3.19 GiB) beside
    /// the bf16 logits, their fp32 copy and `log_softmax`'s output.
    fn smollm2_amp(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("engine", "hf"),
                ("model-type", "llama"),
                ("layers", "24"),
                ("hidden-size", "2048"),
                ("attention-heads", "32"),
                ("kv-heads", "32"),
                ("head-dim", "64"),
                ("vocab-size", "49152"),
                ("intermediate-size", "8192"),
                ("tied-embeddings", "true"),
                ("params", "1711376384"),
                ("workload", "training"),
                ("dtype", "fp16-amp"),
                ("batch", "4"),
                ("context-tokens", "2048"),
                ("gradient-checkpointing", "full"),
            ],
            extra,
        )
    }

    #[test]
    fn autocast_keeps_every_trainable_weight_copy_until_the_forward_ends() {
        use crate::model::estimate::testing::part;
        let e = smollm2_amp(&[("optimizer", "sgd")]);
        let (t, v) = (4.0 * 2048.0, 49152.0);
        assert_eq!(part(&e, "autocast-weights"), 2.0 * 1_711_376_384.0);
        assert_eq!(part(&e, "logits"), (2.0 + 8.0) * t * v);
        // Each layer's fp32 input (checkpointed) and the final norm's and head's saved inputs.
        assert_eq!(part(&e, "activations"), (24.0 * 4.0 + 10.0) * t * 2048.0);
        assert_eq!(part(&e, "gradients"), 0.0);
        // LoRA's frozen weights are not cached: their casts die with each layer's forward.
        let lora = smollm2_amp(&[("workload", "lora"), ("lora-rank", "8")]);
        assert!(part(&lora, "autocast-weights") < 1e9);
    }

    /// The LoRA factors are fp32 leaves that require grad, so autocast caches their 16-bit
    /// casts for the whole forward and, without recomputation, each linear node saves its
    /// factor's cast for backward: beside the frozen weights' casts, at backward's start.
    #[test]
    fn autocast_keeps_the_lora_factors_copies_too() {
        use crate::model::estimate::testing::part;
        let lora = smollm2_amp(&[
            ("workload", "lora"),
            ("lora-rank", "64"),
            ("gradient-checkpointing", "none"),
        ]);
        // The frozen weights' casts are every parameter's (the embedding is the tied head);
        // the factors' are half their fp32 bytes ("adapters").
        assert_eq!(
            part(&lora, "autocast-weights"),
            2.0 * 1_711_376_384.0 + part(&lora, "adapters") / 2.0
        );
    }
}
